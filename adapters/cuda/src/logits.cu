// The logits op of the raw adapter: the C argument struct as a reco::logits::call, run by the
// library (reco/logits/call.cuh: the dtype switch the LibTorch adapter uses too).
#include "library.hpp"

#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/logits/call.cuh"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
namespace {

logits::dtype dtype_of(reco_cuda_dtype t) {
  switch (t) {
    case RECO_CUDA_FLOAT64: return logits::dtype::f64;
    case RECO_CUDA_BFLOAT16: return logits::dtype::bf16;
    case RECO_CUDA_FLOAT16: return logits::dtype::f16;
    default: return logits::dtype::f32;  // validate() admits the four dtypes only
  }
}

// The C argument struct as the library's logits call (reco/logits/call.hpp).
logits::call call_of(const reco_cuda_logits_args& a, cudaStream_t stream) {
  logits::call c;
  c.type = dtype_of(a.dtype);
  c.logits = a.logits;
  c.rows = a.rows;
  c.vocab = a.vocab;
  c.row_stride = a.row_stride;
  c.tokens = a.tokens;
  c.temperature = a.temperature;
  c.row_mask = a.row_mask;
  c.logp = a.logp;
  c.entropy = a.entropy;
  c.lse = a.lse;
  c.sum_p_squared = a.sum_p_squared;
  c.grad_logp = a.grad_logp;
  c.grad_entropy = a.grad_entropy;
  c.saved_lse = a.saved_lse;
  c.saved_entropy = a.saved_entropy;
  c.dlogits = a.dlogits;
  c.stream = stream;
  c.error_flags = a.error_flags;
  return c;
}

}  // namespace

namespace parts {

void logits_forward_device(const reco_cuda_logits_args& a, cudaStream_t stream) {
  logits::forward_cuda(call_of(a, stream));
}

void logits_backward_device(const reco_cuda_logits_args& a, cudaStream_t stream) {
  logits::backward_cuda(call_of(a, stream));
}

}  // namespace parts
}  // namespace cuda_adapter
RECO_NAMESPACE_END
