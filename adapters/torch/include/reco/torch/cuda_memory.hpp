// A reco::memory_resource over PyTorch's CUDA caching allocator, so that reco's device scratch
// comes from (and returns to) the same pool as the tensors. Allocations are tied to one stream:
// memory freed here is reused only by later work on that stream, so freeing right after
// enqueueing the kernels that use it is safe. Available when LibTorch has CUDA.
#pragma once

#ifndef RECO_TORCH_WITH_CUDA
#define RECO_TORCH_WITH_CUDA 0
#endif

#if RECO_TORCH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

class caching_allocator_resource final : public reco::memory_resource {
 public:
  // The current CUDA device must be the tensors' device while allocating.
  explicit caching_allocator_resource(cudaStream_t stream) : stream_(stream) {}
  void* allocate(std::size_t bytes) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream_);
  }
  void deallocate(void* p, std::size_t) override { c10::cuda::CUDACachingAllocator::raw_delete(p); }

 private:
  cudaStream_t stream_;
};

}  // namespace torch
RECO_NAMESPACE_END
#endif
