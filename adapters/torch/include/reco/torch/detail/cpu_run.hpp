// Runs an objective on the CPU backend for a run_request (LibTorch-free).
#pragma once

#include "reco/backend/cpu.hpp"
#include "reco/workspace.hpp"
#include "reco/torch/detail/plan_ops.hpp"
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

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
