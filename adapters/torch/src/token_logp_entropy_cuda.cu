// The CUDA side of token_logp_entropy: raw-pointer calls of the reco::logits CUDA kernels on the
// caller's stream (no LibTorch headers here).
#include <cuda_runtime.h>

#include "logits_call.hpp"
#include "reco/logits/logp_entropy.cuh"

namespace reco::torch::detail {
namespace {

template <class T>
struct type_tag {
  using type = T;
};

template <class F>
void dispatch(logit_type t, F&& f) {
  switch (t) {
    case logit_type::f32: f(type_tag<float>{}); break;
    case logit_type::f64: f(type_tag<double>{}); break;
    case logit_type::bf16: f(type_tag<reco::bf16_t>{}); break;
    case logit_type::f16: f(type_tag<reco::f16_t>{}); break;
  }
}

}  // namespace

void logits_forward_cuda(const logits_call& c, int* error_flags) {
  dispatch(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = reco::logits::accum_t<T>;
    reco::logits::forward_cuda(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens,
                               c.temperature, c.row_mask, static_cast<A*>(c.logp), static_cast<A*>(c.entropy),
                               static_cast<A*>(c.lse), static_cast<cudaStream_t>(c.stream), nullptr, error_flags);
  });
}

void logits_backward_cuda(const logits_call& c) {
  dispatch(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = reco::logits::accum_t<T>;
    reco::logits::backward_cuda(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens,
                                c.temperature, c.row_mask, static_cast<const A*>(c.grad_logp),
                                static_cast<const A*>(c.grad_entropy), static_cast<const A*>(c.saved_lse),
                                static_cast<const A*>(c.saved_entropy), static_cast<T*>(c.dlogits),
                                static_cast<cudaStream_t>(c.stream));
  });
}

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) return false;
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace reco::torch::detail
