// reco's raw CUDA adapter, C++ interface: the objective (presets by name, or any composed
// objective via reco/cuda_adapter/objective.cuh) and the log-probability / entropy op on raw
// device pointers with sizes and a cudaStream_t. The argument structs are the C interface's
// (reco_cuda.h); errors throw reco::error naming the argument ("args.old_logp", "preset", ...).
//
//   reco::cuda_adapter::context ctx;                        // owns the reusable workspace
//   reco_cuda_objective_args args{};                         // device pointers and sizes
//   args.dtype = RECO_CUDA_FLOAT32; args.responses = R; ...
//   reco::objective_result r = reco::cuda_adapter::run_preset("reco", args, stream, ctx);  // syncs
//   // or, without a synchronisation, into device memory the trainer owns:
//   reco::cuda_adapter::run_preset_async("reco", args, stream, ctx, d_result);
//   // with parameters set by key (reco/registry.hpp; override_keys("reco") lists them):
//   reco::cuda_adapter::run_preset("reco", {{"clip.eps_high", 0.28}, {"kl.beta", 0.01}}, args, stream, ctx);
//
// Host code (no nvcc needed): the presets are compiled into the reco_cuda_adapter library.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reco/workspace.hpp"
#include "reco/config.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

struct context_options {
  int max_blocks = 0;           // see reco::fused_options::max_blocks
  bool vector_loads = true;     // see reco::fused_options::vector_loads
  bool check_pointers = false;  // ask the driver that every pointer is device memory (a few us)
};

// Owns a reco::workspace<reco::cuda_fused> (device scratch reused across calls; from `resource`
// when given, e.g. a framework's caching allocator). Use one context per stream at a time.
class context {
 public:
  explicit context(context_options options = {}, memory_resource* resource = nullptr);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  context_options& options() { return options_; }
  const context_options& options() const { return options_; }

  struct impl;  // defined in reco/cuda_adapter/context_impl.cuh (nvcc)
  impl& state() { return *impl_; }

 private:
  context_options options_;
  std::unique_ptr<impl> impl_;
};

// Parameter overrides: ("<component>.<field>", value) pairs, applied in order (reco/registry.hpp).
using override_list = std::vector<std::pair<std::string, double>>;

// The presets by name (the core registry's list, reco/registry.hpp).
const std::vector<std::string>& preset_names();
// What a preset reads and writes (throws reco::error naming "preset" for an unknown name).
objective_needs preset_needs(const std::string& preset);
// The override keys a preset accepts ("clip.eps_high", "kl.beta", ...).
std::vector<std::string> override_keys(const std::string& preset);
// Applies overrides to the preset on the host and runs its parameter checks, touching no device:
// throws reco::error naming "preset", or "overrides.<key>" for an unknown key, a bad flag or
// choice value, or a key given twice, or the parameter out of range.
void check_overrides(const std::string& preset, const override_list& overrides);

// Runs a preset and returns its result on the host: synchronises the stream and throws
// reco::error when the data failed a check (as reco::objective's synchronous call does).
objective_result run_preset(const std::string& preset, const reco_cuda_objective_args& args, cudaStream_t stream,
                            context& ctx);
// Stream-ordered form, no synchronisation: the result is copied into `device_result` (device
// memory) when given and that pointer is returned; otherwise the returned pointer is the
// context's workspace copy, valid until the context's next call. Check result->status.
const objective_result* run_preset_async(const std::string& preset, const reco_cuda_objective_args& args,
                                         cudaStream_t stream, context& ctx, objective_result* device_result = nullptr);
// The same with parameter overrides (checked as check_overrides does, before any device work).
objective_result run_preset(const std::string& preset, const override_list& overrides,
                            const reco_cuda_objective_args& args, cudaStream_t stream, context& ctx);
const objective_result* run_preset_async(const std::string& preset, const override_list& overrides,
                                         const reco_cuda_objective_args& args, cudaStream_t stream, context& ctx,
                                         objective_result* device_result = nullptr);

// reco::logits::forward_cuda / backward_cuda on the C struct, validated first (and its pointers
// checked with the driver when check_pointers). Stream-ordered; the kernels report a bad token
// or an all -inf row in args.error_flags (reco::logits::throw_if_error_flags on the host copy).
void logits_forward(const reco_cuda_logits_args& args, cudaStream_t stream, bool check_pointers = false);
void logits_backward(const reco_cuda_logits_args& args, cudaStream_t stream, bool check_pointers = false);

}  // namespace cuda_adapter
RECO_NAMESPACE_END
