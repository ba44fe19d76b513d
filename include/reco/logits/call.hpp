// One call of the log-probability / entropy kernels as raw pointers: the description both
// adapters fill (the LibTorch adapter from tensors, the raw CUDA adapter from its C argument
// struct) and the one switch over the logits' dtype that picks the kernels' instantiation. This
// header runs a call on the CPU (logp_entropy.hpp); call.cuh runs it on a CUDA stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "reco/config.hpp"
#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace logits {

enum class dtype : int { f32, f64, bf16, f16 };

// Bytes of one logit, and of one per-row value (accum_t: double for f64 logits, float otherwise).
inline std::size_t value_bytes(dtype t) { return t == dtype::f64 ? 8 : (t == dtype::f32 ? 4 : 2); }
inline std::size_t accum_bytes(dtype t) { return t == dtype::f64 ? 8 : 4; }

// Rows r = 0 .. rows - 1 of logits start at logits + r * row_stride (in logits). Per-row arrays
// have type accum_t of the logits' type. A null output is not computed.
struct call {
  dtype type = dtype::f32;
  const void* logits = nullptr;
  index_t rows = 0, vocab = 0, row_stride = 0;
  const std::int64_t* tokens = nullptr;
  double temperature = 1.0;
  const std::uint8_t* row_mask = nullptr;  // 0 = padding row: never read, outputs 0, dlogits row 0
  // forward outputs
  void* logp = nullptr;
  void* entropy = nullptr;
  void* lse = nullptr;
  void* sum_p_squared = nullptr;
  // backward inputs (a null gradient is zero) and output (same row_stride as logits; may be logits)
  const void* grad_logp = nullptr;
  const void* grad_entropy = nullptr;
  const void* saved_lse = nullptr;
  const void* saved_entropy = nullptr;
  void* dlogits = nullptr;
  // CUDA: the stream (a cudaStream_t) and an optional device int the kernels OR error bits into
  void* stream = nullptr;
  int* error_flags = nullptr;
};

template <class T>
struct type_tag {
  using type = T;
};

// f(type_tag<T>{}) for the logits' type T.
template <class F>
void with_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: f(type_tag<float>{}); break;
    case dtype::f64: f(type_tag<double>{}); break;
    case dtype::bf16: f(type_tag<bf16_t>{}); break;
    case dtype::f16: f(type_tag<f16_t>{}); break;
  }
}

// The call on the calling thread's CPU (errors throw reco::error).
inline void forward_cpu(const call& c) {
  with_dtype(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = accum_t<T>;
    logits::forward(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens, c.temperature,
                    c.row_mask, static_cast<A*>(c.logp), static_cast<A*>(c.entropy), static_cast<A*>(c.lse),
                    static_cast<A*>(c.sum_p_squared));
  });
}

inline void backward_cpu(const call& c) {
  with_dtype(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = accum_t<T>;
    logits::backward(static_cast<const T*>(c.logits), c.rows, c.vocab, c.row_stride, c.tokens, c.temperature,
                     c.row_mask, static_cast<const A*>(c.grad_logp), static_cast<const A*>(c.grad_entropy),
                     static_cast<const A*>(c.saved_lse), static_cast<const A*>(c.saved_entropy),
                     static_cast<T*>(c.dlogits));
  });
}

}  // namespace logits
RECO_NAMESPACE_END
