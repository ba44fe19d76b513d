// The logits op of the raw adapter: reco::logits::forward_cuda / backward_cuda (the library's
// kernels, reco/logits/logp_entropy.cuh) on the C argument struct, for each logits dtype.
#include "library.hpp"

#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.cuh"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
namespace {

template <class T>
void forward_as(const reco_cuda_logits_args& a, cudaStream_t stream) {
  using A = logits::accum_t<T>;
  logits::forward_cuda(static_cast<const T*>(a.logits), a.rows, a.vocab, a.row_stride, a.tokens, a.temperature,
                       a.row_mask, static_cast<A*>(a.logp), static_cast<A*>(a.entropy), static_cast<A*>(a.lse),
                       stream, static_cast<A*>(a.sum_p_squared), a.error_flags);
}

template <class T>
void backward_as(const reco_cuda_logits_args& a, cudaStream_t stream) {
  using A = logits::accum_t<T>;
  logits::backward_cuda(static_cast<const T*>(a.logits), a.rows, a.vocab, a.row_stride, a.tokens, a.temperature,
                        a.row_mask, static_cast<const A*>(a.grad_logp), static_cast<const A*>(a.grad_entropy),
                        static_cast<const A*>(a.saved_lse), static_cast<const A*>(a.saved_entropy),
                        static_cast<T*>(a.dlogits), stream, a.error_flags);
}

}  // namespace

namespace parts {

void logits_forward_device(const reco_cuda_logits_args& a, cudaStream_t stream) {
  switch (a.dtype) {
    case RECO_CUDA_FLOAT32: forward_as<float>(a, stream); break;
    case RECO_CUDA_FLOAT64: forward_as<double>(a, stream); break;
    case RECO_CUDA_BFLOAT16: forward_as<bf16_t>(a, stream); break;
    case RECO_CUDA_FLOAT16: forward_as<f16_t>(a, stream); break;
  }
}

void logits_backward_device(const reco_cuda_logits_args& a, cudaStream_t stream) {
  switch (a.dtype) {
    case RECO_CUDA_FLOAT32: backward_as<float>(a, stream); break;
    case RECO_CUDA_FLOAT64: backward_as<double>(a, stream); break;
    case RECO_CUDA_BFLOAT16: backward_as<bf16_t>(a, stream); break;
    case RECO_CUDA_FLOAT16: backward_as<f16_t>(a, stream); break;
  }
}

}  // namespace parts
}  // namespace cuda_adapter
RECO_NAMESPACE_END
