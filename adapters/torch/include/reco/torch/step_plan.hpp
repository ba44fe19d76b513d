// Split optimizer steps with LibTorch: one step's micro-batches on each data-parallel rank, with
// the loss and gradient of the whole step (docs/distributed.md explains the plan).
//
//   auto plan = reco::torch::build_step_plan(process_group, "reco", micro_batches, overrides, {step});
//   for (std::size_t j = 0; j < micro_batches.size(); ++j) {
//     auto out = reco::torch::policy_loss("reco", micro_batches[j], overrides, plan, j);
//     out.loss.backward();            // gradients accumulate; no division by the number of parts
//   }
//   // DDP/FSDP average the ranks' gradients; the plan already multiplied each rank's loss by W.
//   optimizer.step();
//
// Responses are ordered rank by rank, then micro-batch by micro-batch. A prompt group may span
// micro-batches or ranks when prompt_ids are given: neighbouring parts whose boundary responses
// share a prompt id share that group (with group_offsets, every part's groups are its own).
//
// Collectives on the process group (a constant number, whatever the number of micro-batches):
// one all-gather of 50 integers per rank (the step's layout, the step id, the configuration and
// protocol, a rank's error; none when step_options::layout is given), one all-reduce SUM of the
// summaries (which carry the first histogram of an 80/20 cut), for the 80/20 presets 1 (float)
// or 3 (double) more histogram all-reduces plus one of the per-response cut counts, and the
// confirmation (69 doubles) that every rank holds the same sums. CPU micro-batches: any process group (Gloo). CUDA micro-batches: the
// plan's passes over the tokens run as tensor operations on the device (step_options::passes),
// only per-response values, the cut's histogram and candidates come to the host, the collectives
// run on CUDA tensors of the micro-batches' device (NCCL or Gloo), and the calls run on the
// device. A rank that does not join fails after the process group's timeout
// (ProcessGroupGloo::Options::timeout) with a reco::error naming "process_group". Ranks that
// disagree on the step id, the preset or its overrides fail with a reco::error naming "plan". A
// bad input on any rank fails every rank alike, after the same collective (docs/distributed.md,
// "Failing alike").
// group may be null: gradient accumulation in one process, the same plan without collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "reco/step_plan.hpp"
#include "reco/torch/detail/cpu_run.hpp"
#include "reco/torch/policy_loss.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

// Where this rank's micro-batches sit in the step, for a caller that knows it (every rank's
// share fixed by its sampler): the plan then skips its all-gather of the ranks' shapes, one
// collective fewer. first_group is the step's id of the rank's first prompt group (the id its
// previous rank's last group has, when that group continues here). A layout that does not fit
// the ranks' data fails naming the plan (responses claimed twice or by no rank).
struct step_layout {
  std::int64_t step_responses = -1;  // R of the whole step; -1: not given (exchanged)
  std::int64_t first_response = 0;   // the step index of this rank's first response
  std::int64_t first_group = 0;
  bool given() const { return step_responses >= 0; }
};

// Where the plan's passes over the micro-batches' tokens run. automatic: the library's host passes
// for CPU tensors, tensor operations on the device for CUDA tensors. host: the host passes (CUDA
// micro-batches are copied to the host: the mask and the values the plan reads). tensor_ops:
// tensor operations wherever the tensors are. All give the same plan (the per-response sums of
// old log-probabilities may round differently). Micro-batches with token_advantages or
// rollout_logp always use the host passes.
enum class plan_passes { automatic, host, tensor_ops };

struct step_options {
  std::uint64_t step = 0;  // the step id (a counter), the same on every rank
  // The wrapper averages gradients over the W ranks (DDP, FSDP): the plan multiplies each rank's
  // loss and gradient by W so that the average is the step's gradient. false: plain sum.
  bool average_over_ranks = true;
  step_layout layout{};  // optional (see step_layout)
  plan_passes passes = plan_passes::automatic;
  // The 80/20 cut's windowed first pass over a large micro-batch on the host (reco::window_sampling):
  // its cost, never the plan.
  reco::window_sampling window{};
  // Test and tracing hooks (none by default).
  struct hooks_type {
    // Called after each all-reduce of the plan with its stage index and the summed values, which
    // it may alter (the fault tests corrupt a rank's copy, or end a rank, here).
    std::function<void(int stage, std::vector<double>& summed)> after_sum;
    // Mixed into the id of the plan's protocol this rank runs (the fault tests make ranks that
    // run different builds of the library).
    std::uint64_t build_salt = 0;
  } hooks;
};

// A step's plan on this rank: the core plan and where each of this rank's micro-batches sits.
struct planned_step {
  reco::step_plan plan;
  std::vector<reco::step_part> parts;  // one per micro-batch, in the order given
  int rank = 0, world_size = 1;
  int collectives = 0;                 // issued while building (for the record)
};

namespace detail {
// `early`: an error this rank met before it could set up the plan (its preset), which the other
// ranks learn from the layout's exchange (ops is then unused).
planned_step build_step_plan_impl(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const objective_needs& needs,
                                  const plan_ops& ops, std::uint64_t config,
                                  const std::vector<policy_inputs>& micro_batches, const step_options& options,
                                  const reco::error* early = nullptr);
std::uint64_t config_digest(const std::string& preset, const std::map<std::string, double>& overrides);
}  // namespace detail

// The plan of a preset by name (with overrides) over this rank's micro-batches.
planned_step build_step_plan(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& preset,
                             const std::vector<policy_inputs>& micro_batches,
                             const std::map<std::string, double>& overrides = {}, const step_options& options = {});

// The plan of any objective object (pass the same object to policy_loss(obj, in) with in.plan set).
template <class Objective, class = std::enable_if_t<std::is_class_v<Objective> &&
                                                    !std::is_convertible_v<const Objective&, std::string>>>
planned_step build_step_plan(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const Objective& obj,
                             const std::vector<policy_inputs>& micro_batches, const step_options& options = {}) {
  obj.validate();
  return detail::build_step_plan_impl(group, needs_of<Objective>(), detail::plan_ops_for(obj), 0, micro_batches,
                                      options);
}

// Micro-batch `micro_batch` of a planned step (the preset and overrides the plan was built with).
policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides, const planned_step& plan,
                          std::size_t micro_batch);

// The same steps without state, for bindings whose caller does the collectives (the Python ops):
// `summed` holds the summed summaries of the stages so far. plan_summary returns this micro-
// batch's summary of the next stage (stage 0 when summed is empty), or an empty tensor when the
// plan is complete; the planned policy_loss runs the micro-batch with the plan those summaries
// give. part.step.config is set from the preset and overrides. What is wrong with the part's
// inputs is not raised before the caller's collective: at stage 0 the part sends its refusal
// (reco::refusal_summary), and every part raises it from the sums of the next call. `refused`: an
// error the caller found in the part's own fields (its bounds, the scale), sent the same way.
at::Tensor plan_summary(const std::string& preset, const std::map<std::string, double>& overrides,
                        const reco::step_part& part, const policy_inputs& in, const std::vector<at::Tensor>& summed,
                        plan_passes passes = plan_passes::automatic, const reco::error* refused = nullptr);
policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides, const reco::step_part& part,
                          const std::vector<at::Tensor>& summed, const reco::error* refused = nullptr);

}  // namespace torch
RECO_NAMESPACE_END
