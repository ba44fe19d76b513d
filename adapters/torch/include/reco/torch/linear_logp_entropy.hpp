// reco::torch::linear_logp_entropy: log-probability of the sampled token and entropy from the
// last hidden states and the lm_head, as one autograd function that never holds the [N, V]
// logits (reco/logits/linear_logp_entropy.hpp; docs/logits.md, "From hidden states").
//
//   auto [logp, entropy] = reco::torch::linear_logp_entropy(hidden, lm_head.weight, tokens);
//   // hidden [N, H] or [R, T, H]; weight [V, H] (optionally bias [V]), the same dtype
//   // (float32, float64, bfloat16, float16); tokens [N] or [R, T]
//   // logp, entropy: tokens' shape, float64 for float64 inputs, float32 otherwise
//
// The logits W h + bias of a chunk of tokens at a time are one GEMM (LibTorch's matmul), reduced
// by the reco::logits row kernels; the backward recomputes each chunk's logits and turns them
// into d loss / d hidden, d loss / d weight and d loss / d bias. Extra memory: the chunk's
// workspace (options.memory_budget, 256 MiB by default), independent of N. On the CPU, a forward
// whose backward can run keeps its last chunk's logits until that backward (at most the budget,
// the buffer the backward would take anyway), which then skips their GEMM: with every token in
// one chunk, forward and backward make three GEMMs (options.keep_last_chunk = false: none kept). Rows where row_mask is 0
// are never read and get exactly zero gradient. A zero gradient of the entropy skips its backward.
//
// Vocabulary-parallel (tensor parallelism): with options.vocab_group, each rank passes its rows
// of the lm_head (in rank order: rank 0 holds the first ids) and the same hidden, tokens and
// mask; each chunk's row statistics are combined with one all-reduce, every rank gets the full
// logp and entropy, and the backward sums d loss / d hidden over the ranks (one all-reduce) while
// d loss / d weight stays the rank's shard.
//
// CPU tensors, and CUDA tensors when LibTorch has CUDA (cuBLAS on PyTorch's current stream;
// vocab_group is CPU-only). Every tensor on hidden's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "reco/config.hpp"
#include "reco/torch/policy_loss.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

struct linear_logp_options {
  double temperature = 1.0;
  std::size_t memory_budget = 0;  // bytes of workspace (0: reco::logits::default_linear_memory_budget)
  std::int64_t chunk_rows = 0;    // > 0: tokens per chunk, overriding the budget
  bool keep_last_chunk = true;    // CPU: keep the last chunk's logits for the backward
  c10::intrusive_ptr<c10d::ProcessGroup> vocab_group;  // null: this rank holds the whole vocabulary
};

std::tuple<at::Tensor, at::Tensor> linear_logp_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                       const at::Tensor& tokens, const at::Tensor& bias = {},
                                                       const at::Tensor& row_mask = {},
                                                       const linear_logp_options& options = {});

// Hidden states to a policy loss in one call: logp (and the entropy, when `entropy_input`) from
// the lm_head as above, masked where in.mask is 0 (padding is never read), put into `in`, then
// `loss(in)`: any policy_loss call (a preset, a composition, an objective object, a step plan's
// micro-batch). loss.backward() then reaches hidden, weight and bias through the two autograd
// functions; d loss / d logp is never materialised beyond [N].
//
//   auto out = reco::torch::linear_policy_loss(hidden, head.weight, tokens, in, true,
//       [&](const reco::torch::policy_inputs& x) { return reco::torch::policy_loss("reco", x); });
//   out.loss.backward();
policy_output linear_policy_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& tokens,
                                 policy_inputs in, bool entropy_input,
                                 const std::function<policy_output(const policy_inputs&)>& loss,
                                 const at::Tensor& bias = {}, const linear_logp_options& options = {});

}  // namespace torch
RECO_NAMESPACE_END
