// The state behind reco::cuda_adapter::context: the fused backend's reusable workspace.
// Included by the adapter's nvcc translation units (and by users' .cu files that run composed
// objectives through reco/cuda_adapter/objective.cuh). Requires nvcc.
#pragma once

#include "reco/fused/backend.cuh"
#include "reco/workspace.hpp"
#include "reco/cuda_adapter/adapter.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

struct context::impl {
  workspace<cuda_fused> ws;
  explicit impl(memory_resource* resource) : ws(resource) {}
};

}  // namespace cuda_adapter
RECO_NAMESPACE_END
