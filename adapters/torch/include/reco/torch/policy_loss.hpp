// reco::torch::policy_loss: a reco objective as a LibTorch autograd loss.
//
//   reco::torch::policy_inputs in;
//   in.logp = logp;                 // [R, T] (requires grad), with in.mask [R, T]
//   in.old_logp = old_logp;         // undefined = on-policy
//   in.ref_logp = ref_logp;         // for presets with a KL term
//   in.rewards = rewards;           // [R]
//   in.group_offsets = offsets;     // [P + 1], or in.prompt_ids [R]
//   auto out = reco::torch::policy_loss("reco", in, {{"clip.eps_high", 0.28}});
//   out.loss.backward();            // fills logp.grad()
//
// Given advantages (verl, TRL): pass in.advantages [R] instead of in.rewards. A preset by name
// then runs with its advantage estimator replaced by those values (reco::with_given_advantages),
// everything else unchanged. Groups are needed only where the response weight reads G (ReCo's
// 1/(G pbar_old)): give group_offsets, prompt_ids or in.group_size; for other presets they are
// unused, and so an error.
//
// The objective computes the loss and d loss / d logp (and d loss / d entropy when an entropy
// term is on) in one pass; the autograd node multiplies those saved gradients by the incoming
// gradient. Second derivatives are not available.
//
// CPU tensors run on reco::cpu. CUDA tensors run on reco::cuda on PyTorch's current stream with
// scratch memory from PyTorch's caching allocator when reco_torch was built with CUDA
// (RECO_TORCH_WITH_CUDA=1, set by the target): always for the presets by name, and for an
// objective object when the calling translation unit is compiled by nvcc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>

#include "reco/batch.hpp"
#include "reco/objective.hpp"
#include "reco/registry.hpp"
#include "reco/result.hpp"
#include "reco/torch/detail/cpu_run.hpp"
#include "reco/torch/detail/request.hpp"
#include "reco/torch/stats.hpp"

#ifndef RECO_TORCH_WITH_CUDA
#define RECO_TORCH_WITH_CUDA 0
#endif
#if RECO_TORCH_WITH_CUDA && defined(__CUDACC__)
#define RECO_TORCH_OBJECT_CUDA 1
#include "reco/torch/detail/cuda_run.cuh"
#else
#define RECO_TORCH_OBJECT_CUDA 0
#endif

RECO_NAMESPACE_BEGIN
namespace torch {

struct planned_step;  // reco/torch/step_plan.hpp

struct policy_inputs {
  at::Tensor logp;              // [R, T] padded or [N] packed; float32/float64/bfloat16/float16
  at::Tensor old_logp;          // optional (undefined = on-policy), same shape as logp
  at::Tensor ref_logp;          // optional (KL term)
  at::Tensor entropy;           // optional; gradient flows into it when an entropy term is on
  at::Tensor mask;              // bool/uint8, shape of logp; optional (undefined = all valid)
  at::Tensor offsets;           // [R + 1] int64/int32 for packed (undefined = padded layout)
  at::Tensor rewards;           // [R]
  at::Tensor advantages;        // [R] instead of rewards: replaces the preset's advantage estimator
  at::Tensor token_advantages;  // like logp, instead of advantages: one per token (GAE, ...); CPU
  at::Tensor group_offsets;     // [P + 1] int64/int32, or
  at::Tensor prompt_ids;        // [R] integer ids; each prompt's responses must be contiguous, or
  std::int64_t group_size = 0;  // G of equal groups (0 = not given); see "Given advantages" below
  at::Tensor token_weights;     // optional, like logp (policy term only)
  at::Tensor response_weights;  // optional [R] (reco::caller_weight)
  reco::normalisers normalisers{};
  // CUDA tensors only: copy the diagnostics to the host (one synchronisation per call) and throw
  // reco::error when the data were bad. false: no synchronisation; policy_output::stats stays
  // default and the diagnostics (the status word included) are in policy_output::stats_tensor.
  bool host_stats = true;
  // A micro-batch of a split step (reco/torch/step_plan.hpp): the step's plan from
  // build_step_plan and this micro-batch's index in the list given to it (CPU or CUDA tensors).
  const planned_step* plan = nullptr;
  std::size_t micro_batch = 0;

  // Advantages given (per response or per token) instead of rewards: the preset's estimator is
  // replaced by them.
  bool gives_advantages() const { return (advantages.defined() || token_advantages.defined()) && !rewards.defined(); }
  // optional, like logp: the rollout (inference-engine) log-probs that an expected-count weight
  // with weight.sampling = rollout averages instead of old_logp (CPU tensors only)
  at::Tensor rollout_logp;
};

struct policy_output {
  at::Tensor loss;                // 0-dim; float64 for float64 logp, float32 otherwise
  reco::objective_result stats;   // loss parts and diagnostics (see reco/result.hpp)
  at::Tensor stats_tensor;        // [stats_size] float64 on logp's device; names: stat_names()
};

// The presets by name (grpo, dr_grpo, dapo, ...; reco/registry.hpp). Wherever a preset name is
// taken, a composition ("advantage=grpo ratio=variance clip=ppo ...", reco/composition.hpp) is
// taken too: any objective by naming a component for each slot, run on CPU tensors.
const std::vector<std::string>& preset_names();
// The slots of a composition and the kinds each takes: "slot=kind1|kind2|..." (first: default).
std::vector<std::string> composition_slots();
// The choice parameters of a preset or composition: "key=label0|label1|..." (index = position).
std::vector<std::string> choice_labels(const std::string& preset);
// A preset (or peer preset) as a composition: the spec first, then "key=value" for each parameter.
std::vector<std::string> as_composition(const std::string& preset);
// The peer presets (verl_vanilla, trl_dapo, ...: a preset of the list above with a peer's
// constants; reco/registry.hpp, docs/peers.md) as (name, the preset it runs). Every function that
// takes a preset name takes these too.
std::vector<std::pair<std::string, std::string>> peer_presets();
// The override keys a preset accepts ("clip.eps_high", "kl.beta", ...).
std::vector<std::string> override_keys(const std::string& preset);

// Sets parameters of any objective by key (the key grammar: reco/registry.hpp); throws
// reco::error naming an unknown key, then validates the objective's parameters.
template <class Objective>
void set_params(Objective& obj, const std::map<std::string, double>& overrides) {
  registry::apply_overrides(obj, overrides, "this objective");
}

namespace detail {

// A run_request with the tensors it points into (reco::torch::build_step_plan reads batches
// through it).
struct request_owner {
  run_request request;
  std::vector<at::Tensor> keep;
  bool cuda = false;
};
request_owner make_request(const policy_inputs& in, const objective_needs& needs);

// Validates and converts the tensors, runs the objective through `cpu` or `cuda` (empty when
// this objective cannot run on CUDA from the calling translation unit) and builds the autograd
// node. `who` names the objective in errors ("preset 'dapo'"). Defined in the reco_torch library.
policy_output policy_loss_impl(const policy_inputs& in, const objective_needs& needs, const runner& cpu,
                               const runner& cuda, const std::string& who = "this objective");

}  // namespace detail

// The version compiled by nvcc (which can run CUDA tensors) and the host-only one live in
// different inline namespaces, so that a program mixing .cpp and .cu callers of the same
// objective type links two distinct functions instead of picking one of them.
#if RECO_TORCH_OBJECT_CUDA
inline namespace object_calls_cuda {
#else
inline namespace object_calls_host {
#endif

// Any reco::objective (a preset object with adjusted parameters, or your own composition).
// (Constrained so that a preset name given as a string literal picks the overload below.)
template <class Objective, class = std::enable_if_t<std::is_class_v<Objective> &&
                                                    !std::is_convertible_v<const Objective&, std::string>>>
policy_output policy_loss(const Objective& obj, const policy_inputs& in) {
  obj.validate();
  const detail::runner cpu = [&obj](const detail::run_request& q, objective_result& out) {
    detail::run_cpu(obj, q, out);
  };
  detail::runner cuda;
#if RECO_TORCH_OBJECT_CUDA
  cuda = [&obj](const detail::run_request& q, objective_result&) { detail::run_cuda(obj, q); };
#endif
  return detail::policy_loss_impl(in, detail::needs_of<Objective>(), cpu, cuda);
}

}  // inline namespace

// A preset by name with parameter overrides such as {"clip.eps_high", 0.28}, {"kl.beta", 0},
// {"weight.cap", 5}. Runs on CPU and (when built with CUDA) CUDA tensors.
policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides = {});

}  // namespace torch
RECO_NAMESPACE_END
