// reco::cuda_fused: the CUDA backend with the fused objective kernels.
//
//   #include "reco/fused/objective.cuh"
//   reco::workspace<reco::cuda_fused> ws;                       // reused across steps
//   auto r = obj(reco::cuda_fused{stream}, batch, grads, ws);  // same result as reco::cuda
//
// It is reco::cuda (every primitive, the same stream-ordered memory and workspace scratch), and a
// distinct type so that objective_algorithm<cuda_fused, Objective> selects the fused kernels.
// Opting in is choosing the backend value: code written against reco::cuda keeps the generic
// passes (the in-process reference the fused path is tested against). Requires nvcc.
#pragma once

#include "reco/algorithm/run_objective.hpp"
#include "reco/backend/cuda.cuh"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN

struct fused_options {
  // Caps every fused kernel's grid (0: as many blocks as the device keeps resident). The fixed
  // merge order of the block partials depends only on the grid, so pinning it makes results
  // bitwise identical across devices of different sizes as well as run to run.
  int max_blocks = 0;
  // 16-byte loads and stores in the token kernel when every per-token array is aligned for them
  // (false forces the scalar path; the tests use it to check both paths agree).
  bool vector_loads = true;
};

struct cuda_fused : cuda {
  fused_options options{};
  // Takes calls of a split step (objective::run with a step_plan): the plan's slice is copied to
  // the device with the call. The generic reco::cuda passes do not.
  static constexpr bool takes_step_plans = true;

  cuda_fused() = default;
  explicit cuda_fused(cudaStream_t s, fused_options o = {}) : cuda(s), options(o) {}

  // The workspace binds its scratch through this; it must return the derived type.
  cuda_fused with_scratch(scratch_state* st, memory_resource* resource) const {
    cuda_fused c = *this;
    st->resource = resource;
    c.scratch = st;
    return c;
  }
};

// Declared here and defined in fused/objective.cuh: a call on cuda_fused that does not see the
// definition fails to compile (incomplete type) instead of silently running the generic passes.
template <class Objective>
struct objective_algorithm<cuda_fused, Objective>;

RECO_NAMESPACE_END
