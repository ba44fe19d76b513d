// Random ragged batches for the adapter tests, in both layouts, and their padded form for the
// plain-LibTorch references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "reco/torch/policy_loss.hpp"
#include "torch/torch_reference.hpp"

namespace torch_test {

// One batch in float64: per-token tensors in the batch's layout ([R, T] padded or [N] packed).
struct batch {
  bool packed = false;
  int64_t R = 0, T = 0;  // T: padded width (padded layout only)
  std::vector<int64_t> offsets, group_offsets, lengths, prompt_ids;
  at::Tensor logp, old_logp, ref_logp, entropy, token_weights, mask;  // mask: bool
  at::Tensor rewards;
};

// Groups of 1..6 responses (the first a singleton, one with all-equal rewards), lengths 0..T
// with 0 and 1 always present, masked holes, and per-response off-policy levels from exactly
// on-policy to far off (so that every clip branch, the dual clips and the weight cap occur).
inline batch make_batch(uint64_t seed, bool packed, int groups = 10, int max_len = 16) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 1.0);
  batch b;
  b.packed = packed;
  b.group_offsets.push_back(0);
  std::vector<double> rewards;
  for (int g = 0; g < groups; ++g) {
    int size = g == 0 ? 1 : 1 + static_cast<int>(u01(rng) * 6);
    const bool all_equal = g == 1;
    for (int j = 0; j < size; ++j) {
      rewards.push_back(all_equal ? 1.0 : (u01(rng) < 0.5 ? 1.0 : 0.0));
      int len = static_cast<int>(u01(rng) * (max_len + 1));
      if (j == 1) len = 0;
      if (j == 2) len = 1;
      b.lengths.push_back(std::min(len, max_len));
      b.prompt_ids.push_back(1000 + 7 * g);
    }
    b.group_offsets.push_back(static_cast<int64_t>(rewards.size()));
  }
  b.R = static_cast<int64_t>(rewards.size());
  b.T = max_len;
  std::vector<int64_t> begin(b.R), range(b.R);
  if (packed) {
    b.offsets.push_back(0);
    for (int64_t i = 0; i < b.R; ++i) b.offsets.push_back(b.offsets.back() + b.lengths[i]);
    for (int64_t i = 0; i < b.R; ++i) begin[i] = b.offsets[i], range[i] = b.lengths[i];
  } else {
    for (int64_t i = 0; i < b.R; ++i) begin[i] = i * b.T, range[i] = b.T;
  }
  const int64_t N = packed ? b.offsets.back() : b.R * b.T;
  std::vector<double> lp(N), old(N), ref(N), ent(N), tw(N);
  std::vector<uint8_t> mask(N);
  const double levels[4] = {0.0, 1e-4, 0.05, 0.4};
  for (int64_t i = 0; i < b.R; ++i) {
    const double off = levels[static_cast<int>(u01(rng) * 4)];
    const double shift = u01(rng) < 0.2 ? -2.0 : 0.0;  // unlikely responses hit the weight cap
    for (int64_t t = begin[i]; t < begin[i] + range[i]; ++t) {
      const int64_t pos = t - begin[i];
      const double x = u01(rng);
      double v = x < 0.15 ? -1e-3 * u01(rng) : (x < 0.35 ? -2.0 - 6.0 * u01(rng) : -2.0 * u01(rng));
      v = std::min(v + shift, -1e-7);
      double o = v + off * gauss(rng);
      const double jump = u01(rng);
      if (off > 0 && jump < 0.05) o -= 1.5;       // ratio ~4.5: the hard dual clip for A < 0
      else if (off > 0 && jump < 0.08) o += 1.5;  // ratio ~0.2: ASPO's soft dual clip for A > 0
      lp[t] = v;
      old[t] = std::min(o, -1e-9);
      ref[t] = std::min(v + 0.2 * gauss(rng), 0.0);
      ent[t] = 3.0 * u01(rng);
      tw[t] = 0.5 + u01(rng);
      mask[t] = pos < b.lengths[i] && !(pos > 0 && u01(rng) < 0.1);
    }
  }
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto shape = packed ? std::vector<int64_t>{N} : std::vector<int64_t>{b.R, b.T};
  b.logp = at::tensor(lp, f64).view(shape);
  b.old_logp = at::tensor(old, f64).view(shape);
  b.ref_logp = at::tensor(ref, f64).view(shape);
  b.entropy = at::tensor(ent, f64).view(shape);
  b.token_weights = at::tensor(tw, f64).view(shape);
  b.mask = at::tensor(std::vector<int64_t>(mask.begin(), mask.end()), at::kLong).view(shape).to(at::kBool);
  b.rewards = at::tensor(rewards, f64);
  return b;
}

// The adapter's inputs in dtype `dt`; logp is a fresh leaf that requires grad.
inline reco::torch::policy_inputs inputs(const batch& b, at::ScalarType dt, bool with_token_weights = false) {
  reco::torch::policy_inputs in;
  in.logp = b.logp.to(dt).detach().requires_grad_(true);
  in.old_logp = b.old_logp.to(dt);
  in.ref_logp = b.ref_logp.to(dt);
  in.entropy = b.entropy.to(dt);
  in.mask = b.mask;
  if (b.packed) in.offsets = at::tensor(b.offsets, at::kLong);
  in.rewards = b.rewards.to(dt);
  in.group_offsets = at::tensor(b.group_offsets, at::kLong);
  if (with_token_weights) in.token_weights = b.token_weights.to(dt);
  return in;
}

// The reference's padded view of the adapter's inputs (the same values, rounded through the
// input dtype, in float64). `logp` must be a float64 leaf; the padded logp is differentiable
// back to it, and the padded entropy back to in.entropy when that is a float64 leaf.
inline torch_ref::padded_batch padded_view(const batch& b, const reco::torch::policy_inputs& in, const at::Tensor& logp) {
  torch_ref::padded_batch p;
  auto d = [](const at::Tensor& t) { return t.defined() ? t.detach().to(at::kDouble) : at::Tensor(); };
  p.rewards = d(in.rewards);
  p.group_offsets = b.group_offsets;
  if (!b.packed) {
    p.logp = logp;
    p.old_logp = d(in.old_logp);
    p.ref_logp = d(in.ref_logp);
    p.entropy = in.entropy.to(at::kDouble);
    p.token_weights = d(in.token_weights);
    p.mask = in.mask.to(at::kDouble);
    p.max_length = b.T;
    return p;
  }
  const int64_t L = std::max<int64_t>(1, *std::max_element(b.lengths.begin(), b.lengths.end()));
  std::vector<int64_t> idx(static_cast<size_t>(b.R * L), 0);
  std::vector<double> inside(idx.size(), 0.0);
  for (int64_t i = 0; i < b.R; ++i)
    for (int64_t t = 0; t < b.lengths[i]; ++t) {
      idx[static_cast<size_t>(i * L + t)] = b.offsets[i] + t;
      inside[static_cast<size_t>(i * L + t)] = 1.0;
    }
  const at::Tensor index = at::tensor(idx, at::kLong);
  const at::Tensor in_range = at::tensor(inside, at::kDouble).view({b.R, L});
  auto pad = [&](const at::Tensor& flat) -> at::Tensor {
    if (!flat.defined()) return {};
    if (flat.numel() == 0) return at::zeros({b.R, L}, at::kDouble);
    return flat.index_select(0, index).view({b.R, L}) * in_range;
  };
  p.logp = pad(logp);
  p.old_logp = pad(d(in.old_logp));
  p.ref_logp = pad(d(in.ref_logp));
  p.entropy = pad(in.entropy.to(at::kDouble));
  p.token_weights = pad(d(in.token_weights));
  p.mask = pad(in.mask.to(at::kDouble));
  p.max_length = *std::max_element(b.lengths.begin(), b.lengths.end());
  return p;
}

inline double max_abs(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace torch_test
