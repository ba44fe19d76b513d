// reco::cuda_adapter::context: its workspace lives in the nvcc-only impl.
#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/context_impl.cuh"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

context::context(context_options options, memory_resource* resource)
    : options_(options), impl_(std::make_unique<impl>(resource)) {}
context::~context() = default;

}  // namespace cuda_adapter
RECO_NAMESPACE_END
