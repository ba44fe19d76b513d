// Any composed objective through the raw adapter, on the fused CUDA path. The calling
// translation unit must be compiled by nvcc (it instantiates the kernels); the presets by name
// need no nvcc (adapter.hpp).
//
//   using my_objective = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
//                                        reco::expected_count_weight, reco::token_mean>;
//   my_objective obj;
//   obj.clip.params.eps_high = 0.28;
//   reco::objective_result r = reco::cuda_adapter::run_objective(obj, args, stream, ctx);
#pragma once

#include <cuda_runtime_api.h>

#include "reco/fused/objective.cuh"
#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/context_impl.cuh"
#include "reco/cuda_adapter/pointers.hpp"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

// Stream-ordered: validates on the host, enqueues the fused call, and copies the result into
// `device_result` (device memory) when given. Returns the result's device address (the
// workspace's, valid until the context's next call, when no destination is given).
template <class Obj>
const objective_result* run_objective_async(const Obj& obj, const reco_cuda_objective_args& args, cudaStream_t stream,
                                            context& ctx, objective_result* device_result = nullptr) {
  validate(args, needs_of<Obj>());
  if (ctx.options().check_pointers) {
    check_device_pointers(args);
    if (device_result) check_device_pointer(device_result, "device_result");
  }
  const cuda_fused backend(stream, fused_options{ctx.options().max_blocks, ctx.options().vector_loads});
  workspace<cuda_fused>& ws = ctx.state().ws;
  const normalisers norm = normalisers_of(args);
  const objective_result* r =
      args.dtype == RECO_CUDA_FLOAT64
          ? obj.run(backend, batch_of<double>(args), gradients_of<double>(args), ws, norm)
          : obj.run(backend, batch_of<float>(args), gradients_of<float>(args), ws, norm);
  if (device_result == nullptr) return r;
  ::reco::detail::cuda_check(
      cudaMemcpyAsync(device_result, r, sizeof(objective_result), cudaMemcpyDeviceToDevice, stream),
      "copy of the result");
  return device_result;
}

// Synchronous: the result on the host; throws reco::error when the data failed a check.
template <class Obj>
objective_result run_objective(const Obj& obj, const reco_cuda_objective_args& args, cudaStream_t stream,
                               context& ctx) {
  const objective_result* r = run_objective_async(obj, args, stream, ctx);
  objective_result out;
  ::reco::detail::cuda_check(cudaMemcpyAsync(&out, r, sizeof(objective_result), cudaMemcpyDeviceToHost, stream),
                             "copy of the result");
  ::reco::detail::cuda_check(cudaStreamSynchronize(stream), "synchronize");
  throw_if_error(out.status);
  return out;
}

}  // namespace cuda_adapter
RECO_NAMESPACE_END
