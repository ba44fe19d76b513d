// The CUDA side of linear_logp_entropy (linear_cuda_call.hpp): no LibTorch headers here.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "linear_cuda_call.hpp"
#include "reco/logits/linear_logp_entropy.cuh"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

template <class T>
void linear_forward_on_cuda(const logits::linear_operands<T>& in, const logits::linear_options& options,
                            const logits::linear_outputs<logits::accum_t<T>>& out,
                            const logits::linear_cuda_chunking& plan, const linear_device& where) {
  logits::linear_forward_cuda(static_cast<cublasHandle_t>(where.cublas), in, options, out, where.workspace, plan,
                              static_cast<cudaStream_t>(where.stream), where.error_flags);
}

template <class T>
void linear_backward_on_cuda(const logits::linear_operands<T>& in, const logits::linear_options& options,
                             const logits::linear_gradients<T>& grads, const logits::linear_cuda_chunking& plan,
                             const linear_device& where) {
  logits::linear_backward_cuda(static_cast<cublasHandle_t>(where.cublas), in, options, grads, where.workspace, plan,
                               static_cast<cudaStream_t>(where.stream), where.error_flags);
}

#define RECO_LINEAR_CUDA_INSTANCES(T)                                                                           \
  template void linear_forward_on_cuda<T>(const logits::linear_operands<T>&, const logits::linear_options&,    \
                                          const logits::linear_outputs<logits::accum_t<T>>&,                   \
                                          const logits::linear_cuda_chunking&, const linear_device&);         \
  template void linear_backward_on_cuda<T>(const logits::linear_operands<T>&, const logits::linear_options&,   \
                                           const logits::linear_gradients<T>&, const logits::linear_cuda_chunking&, \
                                           const linear_device&);
RECO_LINEAR_CUDA_INSTANCES(float)
RECO_LINEAR_CUDA_INSTANCES(double)
RECO_LINEAR_CUDA_INSTANCES(bf16_t)
RECO_LINEAR_CUDA_INSTANCES(f16_t)
#undef RECO_LINEAR_CUDA_INSTANCES

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
