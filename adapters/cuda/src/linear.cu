// Logp and entropy from hidden states in the raw adapter: the C argument struct as the
// library's operands, the plan and the device calls of reco/logits/linear_logp_entropy.cuh.
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <memory>
#include <string>

#include "library.hpp"

#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/logits/call.hpp"
#include "reco/logits/linear_logp_entropy.cuh"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
namespace {

using reco::detail::fail;
using reco::detail::require;

logits::dtype dtype_of(reco_cuda_dtype t) {
  switch (t) {
    case RECO_CUDA_FLOAT32: return logits::dtype::f32;
    case RECO_CUDA_FLOAT64: return logits::dtype::f64;
    case RECO_CUDA_BFLOAT16: return logits::dtype::bf16;
    case RECO_CUDA_FLOAT16: return logits::dtype::f16;
  }
  fail("dtype", "must be one of RECO_CUDA_FLOAT32, FLOAT64, BFLOAT16, FLOAT16, got " + std::to_string(static_cast<int>(t)));
}

template <class T>
logits::linear_operands<T> operands_of(const reco_cuda_linear_args& a) {
  logits::linear_operands<T> in;
  in.hidden = static_cast<const T*>(a.hidden);
  in.rows = a.rows;
  in.hidden_size = a.hidden_size;
  in.hidden_stride_row = a.hidden_stride_row;
  in.hidden_stride_col = a.hidden_stride_col;
  in.weight = static_cast<const T*>(a.weight);
  in.vocab = a.vocab;
  in.weight_stride_row = a.weight_stride_row;
  in.weight_stride_col = a.weight_stride_col;
  in.bias = static_cast<const T*>(a.bias);
  in.bias_stride = a.bias_stride;
  in.tokens = a.tokens;
  in.row_mask = a.row_mask;
  return in;
}

logits::linear_options options_of(const reco_cuda_linear_args& a) {
  require(a.memory_budget >= 0, "memory_budget", "must be >= 0 (0: the default)");
  require(a.chunk_rows >= 0, "chunk_rows", "must be >= 0");
  require(a.rows >= 0, "rows", "must be >= 0");
  require(a.hidden_size >= 1, "hidden_size", "must be >= 1");
  require(a.vocab >= 1, "vocab", "must be >= 1");
  require(a.hidden_stride_row >= 0 && a.hidden_stride_col >= 0, "hidden", "strides must be >= 0");
  require(a.bias_stride >= 0, "bias_stride", "must be >= 0");
  logits::linear_options o;
  o.temperature = a.temperature;
  if (a.memory_budget > 0) o.memory_budget = static_cast<std::size_t>(a.memory_budget);
  o.chunk_rows = a.chunk_rows;
  o.sum_p_squared = a.sum_p_squared != nullptr;
  require(std::isfinite(a.temperature) && a.temperature > 0, "temperature", "must be finite and > 0");
  return o;
}

logits::linear_cuda_chunking plan_of(const reco_cuda_linear_args& a) {
  const logits::linear_options o = options_of(a);
  const logits::dtype t = dtype_of(a.dtype);
  return logits::linear_cuda_chunking_of(a.rows, a.vocab, a.hidden_size, logits::value_bytes(t), logits::accum_bytes(t),
                                  o.memory_budget, o.chunk_rows);
}

// The caller's handle, or this thread's (created on first use, destroyed with the thread).
cublasHandle_t handle_of(const reco_cuda_linear_args& a) {
  if (a.cublas_handle) return static_cast<cublasHandle_t>(a.cublas_handle);
  struct owned {
    cublasHandle_t h = nullptr;
    ~owned() {
      if (h) cublasDestroy(h);
    }
  };
  thread_local owned mine;
  if (!mine.h && cublasCreate(&mine.h) != CUBLAS_STATUS_SUCCESS) {
    mine.h = nullptr;
    throw std::runtime_error("reco: cublasCreate failed (is there a CUDA device?)");
  }
  return mine.h;
}

template <class F>
void run(const reco_cuda_linear_args& a, F&& f) {
  const logits::linear_cuda_chunking plan = plan_of(a);
  require(a.rows == 0 || a.workspace != nullptr, "workspace", "is null");
  require(a.workspace_bytes >= static_cast<std::int64_t>(plan.workspace_bytes), "workspace_bytes",
          std::to_string(a.workspace_bytes) + " bytes, the call needs " + std::to_string(plan.workspace_bytes) +
              " (reco_cuda_linear_workspace_bytes)");
  const logits::linear_options o = options_of(a);
  logits::with_dtype(dtype_of(a.dtype), [&](auto tag) {
    using T = typename decltype(tag)::type;
    f(tag, operands_of<T>(a), o, plan);
  });
}

}  // namespace

namespace parts {

std::int64_t linear_workspace_bytes(const reco_cuda_linear_args& a) {
  return static_cast<std::int64_t>(plan_of(a).workspace_bytes);
}

void linear_forward_device(const reco_cuda_linear_args& a, cudaStream_t stream) {
  run(a, [&](auto tag, const auto& in, const logits::linear_options& o, const logits::linear_cuda_chunking& plan) {
    using A = logits::accum_t<typename decltype(tag)::type>;
    const logits::linear_outputs<A> out{static_cast<A*>(a.logp), static_cast<A*>(a.entropy), static_cast<A*>(a.lse),
                                        static_cast<A*>(a.sum_p_squared)};
    logits::linear_forward_cuda(handle_of(a), in, o, out, a.workspace, plan, stream, a.error_flags);
  });
}

void linear_backward_device(const reco_cuda_linear_args& a, cudaStream_t stream) {
  run(a, [&](auto tag, const auto& in, const logits::linear_options& o, const logits::linear_cuda_chunking& plan) {
    using T = typename decltype(tag)::type;
    using A = logits::accum_t<T>;
    logits::linear_gradients<T> g;
    g.grad_logp = static_cast<const A*>(a.grad_logp);
    g.grad_entropy = static_cast<const A*>(a.grad_entropy);
    g.saved_lse = static_cast<const A*>(a.saved_lse);
    g.saved_entropy = static_cast<const A*>(a.saved_entropy);
    g.dhidden = static_cast<T*>(a.dhidden);
    g.dhidden_stride = a.dhidden_stride;
    g.dweight = static_cast<A*>(a.dweight);
    g.dweight_stride = a.dweight_stride;
    g.dbias = static_cast<A*>(a.dbias);
    logits::linear_backward_cuda(handle_of(a), in, o, g, a.workspace, plan, stream, a.error_flags);
  });
}

}  // namespace parts
}  // namespace cuda_adapter
RECO_NAMESPACE_END
