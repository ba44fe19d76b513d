// The step plan's passes over a micro-batch's tokens as tensor operations on the tensors' own
// device (reco::part_token_source): for CUDA micro-batches, the plan reads per-response values,
// the cut's first-digit histogram and its few candidates from the device instead of copying the
// per-token inputs to the host. The same operations run on CPU tensors (the tests compare them
// with the host passes there).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "reco/step_plan.hpp"
#include "reco/torch/policy_loss.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// Counts (int64) of the values 0 .. 2^16 - 1 in d (1-D, an integer type, values in that range).
at::Tensor digit_counts(const at::Tensor& d);

// The plan's crossings between host and device, through page-locked memory: t on the host
// (contiguous; t itself when it is a CPU tensor), and a float64 tensor of `values` on `device`.
at::Tensor to_host(const at::Tensor& t);
at::Tensor float64_tensor_on(const std::vector<double>& values, const at::Device& device);

class tensor_token_passes {
 public:
  // `in` has passed the request's checks (shapes, dtypes); use_double: the plan's value type
  // (float64 inputs) rather than float32.
  tensor_token_passes(const policy_inputs& in, bool use_double);
  // source_'s functions hold `this`: a copy or a move would leave them on the old object.
  tensor_token_passes(const tensor_token_passes&) = delete;
  tensor_token_passes& operator=(const tensor_token_passes&) = delete;
  const reco::part_token_source& source() const { return source_; }

  // Whether the passes can read this micro-batch where it is: not with per-token advantages or
  // rollout log-probabilities (read on the host: the plan copies them).
  static bool applies(const policy_inputs& in) {
    return !in.token_advantages.defined() && !in.rollout_logp.defined();
  }

 private:
  void sums(bool old_mean, bool entropy, bool histogram, reco::part_token_sums& out) const;
  void gather(int done, std::uint64_t lo, std::uint64_t hi, reco::detail::cut_candidates& out) const;
  void count_cut(double cut, std::int64_t* above, std::int64_t* on) const;
  // Per response, the sum of a float64 tensor of the tokens' shape.
  at::Tensor per_response(const at::Tensor& x) const;
  // Per response, the number of true values of a bool tensor of the tokens' shape (float64).
  at::Tensor count_per_response(const at::Tensor& flags) const;

  bool use_double_ = false;
  bool packed_ = false;
  std::int64_t responses_ = 0, width_ = 0;  // R, and T of a padded layout
  at::Tensor logp_, old_logp_, entropy_, offsets_;
  at::Tensor valid_;  // the valid tokens (bool, the tokens' shape: the mask, or all true)
  reco::part_token_source source_;
};

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
