// A logits call (call.hpp) enqueued on its CUDA stream: the CUDA kernels of logp_entropy.cuh for
// the logits' dtype. Errors in the data are ORed into c.error_flags when given. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include "reco/logits/call.hpp"
#include "reco/logits/logp_entropy.cuh"

RECO_NAMESPACE_BEGIN
namespace logits {

inline void forward_cuda(const call& c) {
  with_dtype(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = accum_t<T>;
    logits::forward_cuda(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens, c.temperature,
                         c.row_mask, static_cast<A*>(c.logp), static_cast<A*>(c.entropy), static_cast<A*>(c.lse),
                         static_cast<cudaStream_t>(c.stream), static_cast<A*>(c.sum_p_squared), c.error_flags);
  });
}

inline void backward_cuda(const call& c) {
  with_dtype(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = accum_t<T>;
    logits::backward_cuda(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens, c.temperature,
                          c.row_mask, static_cast<const A*>(c.grad_logp), static_cast<const A*>(c.grad_entropy),
                          static_cast<const A*>(c.saved_lse), static_cast<const A*>(c.saved_entropy),
                          static_cast<T*>(c.dlogits), static_cast<cudaStream_t>(c.stream), c.error_flags);
  });
}

}  // namespace logits
RECO_NAMESPACE_END
