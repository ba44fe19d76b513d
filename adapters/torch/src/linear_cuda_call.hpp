// The CUDA side of linear_logp_entropy, called from linear_logp_entropy.cpp: the device calls of
// reco/logits/linear_logp_entropy.cuh for each storage type, on the stream and cuBLAS handle the
// caller passes (PyTorch's current ones) with a workspace it allocated. LibTorch-free, so that the
// CUDA translation unit needs no LibTorch headers.
#pragma once

#include <cstddef>

#include "reco/config.hpp"
#include "reco/logits/linear_logp_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// Where a call runs: cudaStream_t and cublasHandle_t as void*, the device error word (one int,
// device memory) that the kernels OR their error bits into.
struct linear_device {
  void* stream = nullptr;
  void* cublas = nullptr;
  void* workspace = nullptr;
  int* error_flags = nullptr;
};

template <class T>
void linear_forward_on_cuda(const logits::linear_operands<T>& in, const logits::linear_options& options,
                            const logits::linear_outputs<logits::accum_t<T>>& out,
                            const logits::linear_cuda_chunking& plan, const linear_device& where);
template <class T>
void linear_backward_on_cuda(const logits::linear_operands<T>& in, const logits::linear_options& options,
                             const logits::linear_gradients<T>& grads, const logits::linear_cuda_chunking& plan,
                             const linear_device& where);

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
