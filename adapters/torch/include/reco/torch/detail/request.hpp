// The LibTorch-free seam between the adapter (tensors, validation, autograd) and the objective
// calls (templated on the objective and the backend). The adapter turns tensors into one
// run_request; a runner executes the objective on it. Keeping this header free of LibTorch keeps
// the translation units that instantiate the objectives light.
#pragma once

#include <functional>

#include "reco/batch.hpp"
#include "reco/objective_needs.hpp"
#include "reco/result.hpp"
#include "reco/step_plan.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// What an objective reads and writes (reco/objective_needs.hpp).
using reco::needs_of;
using reco::objective_needs;

// One call, with every array already contiguous, on one device and in the compute type.
struct run_request {
  bool use_double = false;  // batch_d/grads_d when true, batch_f/grads_f otherwise
  batch_view<float> batch_f;
  gradients<float> grads_f;
  batch_view<double> batch_d;
  gradients<double> grads_d;
  normalisers norm;
  // A call of a split step: the step's plan and where this call sits in the step.
  const reco::step_plan* plan = nullptr;
  reco::step_part part{};
  // CUDA only: the device, PyTorch's current stream on it, and where the packed diagnostics
  // (reco::torch::stats_size doubles, device memory) are written, stream-ordered.
  int device = -1;
  void* stream = nullptr;
  double* stats_out = nullptr;
};

// A runner executes the objective. On the CPU it returns the result (and throws on bad data);
// on CUDA it enqueues the work and the packing of the result into request.stats_out.
using runner = std::function<void(const run_request&, objective_result& host_result)>;

// The plan steps of one objective on a run_request's batch (host memory): a part's summary, its move from
// a provisional place in the step to its real one (reco::place_summary), the plan from the summed
// summaries, the cut's candidates gathered early, and a part's summary of the plan's pending round.
// Each step that reads tokens takes an optional reco::part_token_source: the micro-batch's token
// passes as tensor operations on its device (the run_request then holds host copies of its
// per-response inputs and layout only).
struct plan_ops {
  // Which per-token values the plan reads besides the mask: old_logp (logp when on-policy) for a
  // weight that averages it, the entropies for a token selector.
  bool reads_old_mean = true;
  bool reads_entropy = true;
  // A covariance selection (Clip-Cov / KL-Cov): its plan reads logp, on the host.
  bool covariance = false;
  // With a state: the part's windowed stage 0 where it applies (reco::window_sampling), its cut
  // candidates kept in the state for the rounds.
  std::function<reco::step_summary(const run_request&, const reco::step_part&, const reco::part_token_source*,
                                   reco::part_rounds*, const reco::window_sampling&)>
      summarize;
  // The checks of stage 0 that throw (reco::check_part_inputs), and the stage-0 summary of a part
  // that failed them on its rank (reco::refusal_summary: its refusal alone, naming the argument).
  std::function<void(const run_request&, const reco::step_part&)> check;
  std::function<reco::step_summary(const reco::step_info& step, const std::string& argument)> refusal;
  std::function<void(reco::step_summary&, const reco::step_info& provisional, const reco::step_info& step,
                     index_t first_response, index_t first_group)>
      place;
  std::function<reco::step_plan(const reco::step_info&, const reco::step_summary&)> finish;
  // A part's cut candidates gathered right after its own summary (reco::early_window, gather_early).
  std::function<void(const run_request&, const reco::step_summary& own, reco::part_rounds&,
                     const reco::part_token_source*)>
      gather_early;
  std::function<reco::step_summary(const reco::step_plan&, const run_request&, const reco::step_part&,
                                   reco::part_rounds*, const reco::part_token_source*)>
      round;
};

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
