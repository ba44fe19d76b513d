// Runs an objective on the fused CUDA path (reco::cuda_fused, reco/fused/) for a run_request:
// PyTorch's current stream, scratch from the caching allocator, the result packed into a device
// array. The same path as the raw-buffer CUDA adapter (reco/cuda_adapter/objective.cuh). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include "reco/backend/cuda.cuh"
#include "reco/fused/objective.cuh"
#include "reco/workspace.hpp"
#include "reco/torch/cuda_memory.hpp"
#include "reco/torch/detail/request.hpp"
#include "reco/torch/stats.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// A template so that every translation unit may define it.
template <int = 0>
__global__ void pack_stats_kernel(const objective_result* r, double* out) {
  pack_stats(*r, out);
}

// Enqueues the objective (a split step's call with its plan when q.plan is set: the plan's slice
// is copied to the device with it) and the packing of its result into q.stats_out; no host
// synchronisation. The workspace returns its memory to the caching allocator at the end of the
// call, stream-ordered after the kernels that use it.
template <class Objective>
void run_cuda(const Objective& obj, const run_request& q) {
  const auto stream = static_cast<cudaStream_t>(q.stream);
  caching_allocator_resource resource(stream);
  reco::workspace<reco::cuda_fused> ws(&resource);
  const reco::cuda_fused backend(stream);
  const objective_result* r =
      q.plan != nullptr
          ? (q.use_double ? obj.run(backend, q.batch_d, q.grads_d, ws, *q.plan, q.part)
                          : obj.run(backend, q.batch_f, q.grads_f, ws, *q.plan, q.part))
          : (q.use_double ? obj.run(backend, q.batch_d, q.grads_d, ws, q.norm)
                          : obj.run(backend, q.batch_f, q.grads_f, ws, q.norm));
  pack_stats_kernel<<<1, 1, 0, stream>>>(r, q.stats_out);
  reco::detail::cuda_check(cudaGetLastError(), "pack_stats_kernel");
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
