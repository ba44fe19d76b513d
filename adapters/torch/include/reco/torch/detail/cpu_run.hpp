// Runs an objective on the CPU backend for a run_request (LibTorch-free).
#pragma once

#include "reco/backend/cpu.hpp"
#include "reco/workspace.hpp"
#include "reco/torch/detail/request.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// One reusable host workspace per thread, so that steady-state calls allocate no scratch.
inline reco::workspace<reco::cpu>& cpu_workspace() {
  thread_local reco::workspace<reco::cpu> ws;
  return ws;
}

template <class Objective>
void run_cpu(const Objective& obj, const run_request& q, objective_result& out) {
  reco::workspace<reco::cpu>& ws = cpu_workspace();
  if (q.plan != nullptr) {
    out = q.use_double ? obj(reco::cpu{}, q.batch_d, q.grads_d, ws, *q.plan, q.part)
                       : obj(reco::cpu{}, q.batch_f, q.grads_f, ws, *q.plan, q.part);
    return;
  }
  out = q.use_double ? obj(reco::cpu{}, q.batch_d, q.grads_d, ws, q.norm)
                     : obj(reco::cpu{}, q.batch_f, q.grads_f, ws, q.norm);
}

template <class Objective>
plan_ops plan_ops_for(const Objective& obj) {
  plan_ops ops;
  ops.summarize = [obj](const run_request& q, const reco::step_part& part) {
    return q.use_double ? reco::summarize(obj, q.batch_d, part) : reco::summarize(obj, q.batch_f, part);
  };
  ops.place = [obj](reco::step_summary& s, const reco::step_info& provisional, const reco::step_info& step,
                    index_t first_response, index_t first_group) {
    reco::place_summary(obj, s, provisional, step, first_response, first_group);
  };
  ops.finish = [obj](const reco::step_info& step, const reco::step_summary& total) {
    return reco::finish_plan(obj, step, total);
  };
  ops.gather_early = [obj](const run_request& q, const reco::step_summary& own, reco::part_rounds& state) {
    const reco::digit_window w = reco::early_window(obj, own);
    if (q.use_double) reco::gather_early(obj, q.batch_d, w, state);
    else reco::gather_early(obj, q.batch_f, w, state);
  };
  ops.round = [obj](const reco::step_plan& plan, const run_request& q, const reco::step_part& part,
                    reco::part_rounds* state) {
    return q.use_double ? reco::plan_round(obj, plan, q.batch_d, part, state)
                        : reco::plan_round(obj, plan, q.batch_f, part, state);
  };
  return ops;
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
