// The former names of reco/algorithm/step_slice.hpp, for the fused CUDA path (reco/fused/) until
// it spells the new ones: plan_call is step_slice, plan_arrays is step_slice_arrays.
#pragma once

#include "reco/algorithm/step_slice.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {
using plan_call = step_slice;
using plan_arrays = step_slice_arrays;
}  // namespace detail
RECO_NAMESPACE_END
