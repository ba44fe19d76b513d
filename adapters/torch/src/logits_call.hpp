// One call of the log-probability/entropy kernels on a block of equally strided rows, as raw
// pointers (LibTorch-free, so that the CUDA translation unit needs no LibTorch headers).
#pragma once

#include <cstdint>

#include "reco/config.hpp"

namespace reco::torch::detail {

enum class logit_type : int { f32, f64, bf16, f16 };

// Per-row arrays (logp, entropy, lse, gradients) are float64 for f64 logits, float32 otherwise.
struct logits_call {
  logit_type type = logit_type::f32;
  const void* logits = nullptr;
  index_t rows = 0, vocab = 0, row_stride = 0;
  const std::int64_t* tokens = nullptr;
  double temperature = 1.0;
  const std::uint8_t* row_mask = nullptr;
  // forward outputs
  void* logp = nullptr;
  void* entropy = nullptr;
  void* lse = nullptr;
  // backward inputs (null gradient = zero) and output (same row_stride as logits)
  const void* grad_logp = nullptr;
  const void* grad_entropy = nullptr;
  const void* saved_lse = nullptr;
  const void* saved_entropy = nullptr;
  void* dlogits = nullptr;
  // CUDA: the stream to enqueue on
  void* stream = nullptr;
};

// CUDA versions (reco_torch built with CUDA): enqueue on call.stream; the device error word (bad
// token, all -inf row) is ORed into *error_flags (device memory, one int).
void logits_forward_cuda(const logits_call& call, int* error_flags);
void logits_backward_cuda(const logits_call& call);
// Whether `stream` is being captured into a CUDA graph (no synchronisation is allowed then).
bool stream_is_capturing(void* stream);

}  // namespace reco::torch::detail
