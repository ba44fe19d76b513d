// The CUDA side of token_logp_entropy: the reco::logits call on the caller's stream (no LibTorch
// headers here).
#include <cuda_runtime.h>

#include "logits_call.hpp"
#include "reco/logits/call.cuh"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {
void logits_forward_cuda(const logits::call& c, int* error_flags) {
  logits::call k = c;
  k.error_flags = error_flags;
  logits::forward_cuda(k);
}

void logits_backward_cuda(const logits::call& c) { logits::backward_cuda(c); }

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) return false;
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
