// reco::torch::token_logp_entropy: log-probability of the sampled token and entropy of the
// sampling distribution from logits, as one autograd function (definitions: docs/logits.md).
//
//   auto [logp, entropy] = reco::torch::token_logp_entropy(logits, tokens, /*temperature=*/0.7);
//   // logits [N, V] or [R, T, V] (float32, float64, bfloat16 or float16), tokens [N] or [R, T]
//   // logp, entropy: the shape of tokens; float64 for float64 logits, float32 otherwise
//
// z = logits / temperature; logp = z[token] - logsumexp(z); entropy = -sum softmax(z) log softmax(z).
// The forward reads the logits once and keeps only the per-row log-sum-exp for the backward,
// which reads them once more and writes d loss / d logits (no [N, V] float32 temporary).
// Rows where row_mask is 0 are never read: their outputs are 0 and their gradient is exactly 0.
// -inf logits mean probability 0 (no NaN). Gradients flow from both outputs into the logits.
//
// Layout: the vocabulary dimension must have stride 1; rows may be strided (for example
// logits[:, :-1, :] of a [R, T + 1, V] tensor is used without a copy).
#pragma once

#include <tuple>

#include <ATen/ATen.h>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

std::tuple<at::Tensor, at::Tensor> token_logp_entropy(const at::Tensor& logits, const at::Tensor& tokens,
                                                      double temperature = 1.0, const at::Tensor& row_mask = {});

}  // namespace torch
RECO_NAMESPACE_END
