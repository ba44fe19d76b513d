// A call of a split step: one part's share of the step's loss and gradient under the step's plan
// (objective::run / operator() with a step_plan and a step_part forward here). The parts' results
// add up to one call on the whole step. Backends that take a plan: host-accessible ones
// (reco::cpu) and reco::cuda_fused, which copies the plan's slice to the device with the call.
#pragma once

#include <type_traits>

#include "reco/algorithm/step_slice.hpp"
#include "reco/algorithm/run_objective.hpp"
#include "reco/backend/concept.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/result.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/step.hpp"
#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class Plan>
struct planned_call;  // declared by reco/objective.hpp too, whose planned calls forward here
template <>
struct planned_call<step_plan> {
  template <class Obj, class Backend, class T>
  static const objective_result* run(const Obj& obj, const Backend& backend, const batch_view<T>& batch,
                                     gradients<T> grads, workspace<Backend>& ws, const step_plan& plan,
                                     const step_part& part) {
    static_assert(takes_step_plans_v<Backend>,
                  "reco::objective: calls with a step plan run on reco::cpu or reco::cuda_fused");
    obj.check_call(backend, batch, grads, normalisers{});
    require(plan_fingerprint(obj, part.step, sizeof(T)) == plan.fingerprint(), "plan",
            "was built for another step, objective or value type than this call");
    const step_slice slice = plan.call_for(part.first_response, batch.layout.responses);
    return objective_algorithm<Backend, Obj>::run(obj.prepared(), backend, batch, grads, ws, normalisers{}, &slice);
  }
};

}  // namespace detail
RECO_NAMESPACE_END
