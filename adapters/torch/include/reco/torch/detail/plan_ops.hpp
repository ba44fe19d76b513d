// The plan steps of one objective on a run_request's batch (host memory; LibTorch-free): shared by
// the CPU presets and, for CUDA tensors, the CUDA presets' form (the plan of a step whose calls run
// on the device is made on the host from host copies of what it reads).
#pragma once

#include "reco/algorithm/call_stages.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/step_plan.hpp"
#include "reco/torch/detail/request.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

template <class Objective>
plan_ops plan_ops_for(const Objective& obj) {
  plan_ops ops;
  ops.reads_old_mean = reco::detail::needs_old_mean(obj.weight);
  const reco::objective_stages stages = reco::stages_of(obj);
  ops.reads_entropy = stages.selection && !stages.covariance;  // covariances are made from logp
  ops.covariance = stages.covariance;
  ops.summarize = [obj](const run_request& q, const reco::step_part& part, const reco::part_token_source* tokens,
                        reco::part_rounds* state, const reco::window_sampling& sampling) {
    if (state)
      return q.use_double ? reco::summarize(obj, q.batch_d, part, *state, sampling, tokens)
                          : reco::summarize(obj, q.batch_f, part, *state, sampling, tokens);
    return q.use_double ? reco::summarize(obj, q.batch_d, part, tokens) : reco::summarize(obj, q.batch_f, part, tokens);
  };
  ops.check = [obj](const run_request& q, const reco::step_part& part) {
    if (q.use_double) reco::check_part_inputs(obj, q.batch_d, part);
    else reco::check_part_inputs(obj, q.batch_f, part);
  };
  ops.refusal = [obj](const reco::step_info& step, const std::string& argument) {
    return reco::refusal_summary(obj, step, argument);
  };
  ops.place = [obj](reco::step_summary& s, const reco::step_info& provisional, const reco::step_info& step,
                    index_t first_response, index_t first_group) {
    reco::place_summary(obj, s, provisional, step, first_response, first_group);
  };
  ops.finish = [obj](const reco::step_info& step, const reco::step_summary& total) {
    return reco::finish_plan(obj, step, total);
  };
  ops.gather_early = [obj](const run_request& q, const reco::step_summary& own, reco::part_rounds& state,
                           const reco::part_token_source* tokens) {
    const reco::digit_window w = reco::early_window(obj, own);
    if (q.use_double) reco::gather_early(obj, q.batch_d, w, state, tokens);
    else reco::gather_early(obj, q.batch_f, w, state, tokens);
  };
  ops.round = [obj](const reco::step_plan& plan, const run_request& q, const reco::step_part& part,
                    reco::part_rounds* state, const reco::part_token_source* tokens) {
    return q.use_double ? reco::plan_round(obj, plan, q.batch_d, part, state, tokens)
                        : reco::plan_round(obj, plan, q.batch_f, part, state, tokens);
  };
  return ops;
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
