// The former names of reco/algorithm/call_stages.hpp, for the fused CUDA path (reco/fused/) until
// it spells the new ones: objective_plan is call_stages, plan_of is call_stages_of.
#pragma once

#include "reco/algorithm/call_stages.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {
using objective_plan = call_stages;
template <class Obj>
call_stages plan_of(const Obj& obj, bool advantages_given, bool token_advantages_given) {
  return call_stages_of(obj, advantages_given, token_advantages_given);
}
}  // namespace detail
RECO_NAMESPACE_END
