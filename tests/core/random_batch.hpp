// Random ragged test batches: one master copy in double, typed copies for the library (float or
// double, packed or padded) and the same values (after rounding to the tested type) for the
// independent reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reco/batch.hpp"
#include "reference/reco_ref.hpp"

namespace reco_test {

using reco::index_t;

struct batch_spec {
  int groups = 6;
  int max_group = 8;          // group sizes drawn in [1, max_group]
  int max_length = 12;        // response lengths drawn in [0, max_length]
  bool padded = false;
  double off_policy = 0.3;    // std of old_logp - logp
  double ref_shift = 0.2;     // std of ref_logp - logp
  double masked_row = 0.1;    // probability that a response is fully masked
  double mask_hole = 0.1;     // probability of an interior masked token (padded: holes too)
  bool binary_rewards = true;
  bool token_weights = false;
  bool response_weights = false;
  bool token_advantages = false;  // advantages per token (N) instead of per response
};

struct master_batch {
  bool padded = false;
  index_t R = 0, T = 0, N = 0;
  std::vector<index_t> offsets;        // packed: R + 1
  std::vector<index_t> group_offsets;  // P + 1
  std::vector<double> logp, old_logp, ref_logp, entropy, token_weights;
  std::vector<std::uint8_t> mask;
  std::vector<double> rewards, advantages, response_weights;
  std::vector<double> token_advantages;  // N, or empty
  std::vector<index_t> lengths;        // range length of each response (before masking)

  index_t begin(index_t i) const { return padded ? i * T : offsets[i]; }
  index_t end(index_t i) const { return padded ? (i + 1) * T : offsets[i + 1]; }
};

inline master_batch make_batch(std::uint64_t seed, const batch_spec& spec) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 1.0);
  master_batch b;
  b.padded = spec.padded;
  b.group_offsets.push_back(0);
  for (int g = 0; g < spec.groups; ++g) {
    // Always include singletons and a few all-equal groups across a test sweep.
    int size = 1 + static_cast<int>(u01(rng) * spec.max_group);
    if (g == 0) size = 1;
    size = std::min(size, spec.max_group);
    const int pattern = static_cast<int>(u01(rng) * 4);  // 0: all equal, else mixed
    const double all_value = u01(rng) < 0.5 ? 0.0 : 1.0;
    for (int j = 0; j < size; ++j) {
      double s;
      if (spec.binary_rewards)
        s = pattern == 0 ? all_value : (u01(rng) < 0.5 ? 1.0 : 0.0);
      else
        s = pattern == 0 ? all_value : gauss(rng);
      b.rewards.push_back(s);
      b.advantages.push_back(gauss(rng));
      b.response_weights.push_back(0.2 + 2.0 * u01(rng));
      int len = static_cast<int>(u01(rng) * (spec.max_length + 1));
      if (j == 1) len = 0;
      if (j == 2) len = 1;
      b.lengths.push_back(std::min(len, spec.max_length));
    }
    b.group_offsets.push_back(static_cast<index_t>(b.rewards.size()));
  }
  b.R = static_cast<index_t>(b.rewards.size());
  if (spec.padded) {
    b.T = spec.max_length;
    b.N = b.R * b.T;
  } else {
    b.offsets.push_back(0);
    for (index_t i = 0; i < b.R; ++i) b.offsets.push_back(b.offsets.back() + b.lengths[static_cast<std::size_t>(i)]);
    b.N = b.offsets.back();
  }
  const auto N = static_cast<std::size_t>(b.N);
  b.logp.assign(N, 0.0);
  b.old_logp.assign(N, 0.0);
  b.ref_logp.assign(N, 0.0);
  b.entropy.assign(N, 0.0);
  b.token_weights.assign(N, 1.0);
  b.mask.assign(N, 0);
  for (index_t i = 0; i < b.R; ++i) {
    const bool masked_row = u01(rng) < spec.masked_row;
    const index_t len = b.lengths[static_cast<std::size_t>(i)];
    for (index_t t = b.begin(i); t < b.end(i); ++t) {
      const auto k = static_cast<std::size_t>(t);
      const index_t pos = t - b.begin(i);
      // log-probabilities spread over saturated and uncertain tokens
      const double x = u01(rng);
      double lp = x < 0.15 ? -1e-3 * u01(rng) : (x < 0.3 ? -6.0 * u01(rng) - 2.0 : -2.0 * u01(rng));
      if (lp == 0.0) lp = -1e-7;
      b.logp[k] = lp;
      double old = lp + spec.off_policy * gauss(rng);
      b.old_logp[k] = std::min(old, -1e-9);
      b.ref_logp[k] = std::min(lp + spec.ref_shift * gauss(rng), 0.0);
      b.entropy[k] = 3.0 * u01(rng);
      b.token_weights[k] = 0.5 + u01(rng);
      bool valid = pos < len && !masked_row;
      if (valid && pos > 0 && u01(rng) < spec.mask_hole) valid = false;
      b.mask[k] = valid ? 1 : 0;
    }
  }
  if (!spec.token_weights) b.token_weights.clear();
  if (!spec.response_weights) b.response_weights.clear();
  if (spec.token_advantages) {
    // From a stream of their own, so that every other input stays the batch of this seed. A
    // response's values mostly share a sign (as GAE's do), with some zeros and sign changes.
    std::mt19937_64 arng(seed ^ 0x7A3D5C1B2E4F6A89ull);
    b.token_advantages.assign(N, 0.0);
    for (index_t i = 0; i < b.R; ++i)
      for (index_t t = b.begin(i); t < b.end(i); ++t) {
        const double x = u01(arng);
        b.token_advantages[static_cast<std::size_t>(t)] =
            x < 0.1 ? 0.0 : b.advantages[static_cast<std::size_t>(i)] + 0.7 * gauss(arng);
      }
    b.advantages.clear();
  }
  return b;
}

// Rounds every value through T so that the reference sees exactly what the library sees.
template <class T>
void round_to(master_batch& b) {
  for (auto* v : {&b.logp, &b.old_logp, &b.ref_logp, &b.entropy, &b.token_weights, &b.rewards, &b.advantages,
                  &b.response_weights, &b.token_advantages})
    for (double& x : *v) x = static_cast<double>(static_cast<T>(x));
}

// Owning typed copies and a view for the library.
template <class T>
struct typed_batch {
  std::vector<T> logp, old_logp, ref_logp, entropy, token_weights, rewards, advantages, response_weights,
      token_advantages;
  std::vector<std::uint8_t> mask;
  std::vector<index_t> offsets, group_offsets;
  bool padded = false;
  index_t R = 0, T_len = 0;

  explicit typed_batch(const master_batch& m)
      : logp(m.logp.begin(), m.logp.end()),
        old_logp(m.old_logp.begin(), m.old_logp.end()),
        ref_logp(m.ref_logp.begin(), m.ref_logp.end()),
        entropy(m.entropy.begin(), m.entropy.end()),
        token_weights(m.token_weights.begin(), m.token_weights.end()),
        rewards(m.rewards.begin(), m.rewards.end()),
        advantages(m.advantages.begin(), m.advantages.end()),
        response_weights(m.response_weights.begin(), m.response_weights.end()),
        token_advantages(m.token_advantages.begin(), m.token_advantages.end()),
        mask(m.mask),
        offsets(m.offsets),
        group_offsets(m.group_offsets),
        padded(m.padded),
        R(m.R),
        T_len(m.T) {}

  reco::batch_view<T> view() const {
    reco::batch_view<T> v;
    v.layout = padded ? reco::padded(R, T_len) : reco::packed(reco::span<const index_t>(offsets));
    v.group_offsets = group_offsets;
    v.logp = logp;
    v.old_logp = old_logp;
    v.ref_logp = ref_logp;
    v.entropy = entropy;
    v.mask = mask;
    v.token_weights = token_weights;
    v.rewards = rewards;
    v.advantages = advantages;
    v.response_weights = response_weights;
    v.token_advantages = token_advantages;
    return v;
  }
};

inline reco_ref::batch to_reference(const master_batch& m) {
  reco_ref::batch r;
  for (index_t i = 0; i < m.R; ++i) {
    r.token_begin.push_back(m.begin(i));
    r.token_end.push_back(m.end(i));
  }
  r.num_tokens = m.N;
  index_t longest = 0;
  for (index_t i = 0; i < m.R; ++i) longest = std::max(longest, m.end(i) - m.begin(i));
  r.max_length = m.padded ? m.T : longest;
  r.logp = m.logp;
  r.old_logp = m.old_logp;
  r.ref_logp = m.ref_logp;
  r.entropy = m.entropy;
  r.mask = m.mask;
  r.token_weights = m.token_weights;
  r.rewards = m.rewards;
  r.advantages = m.advantages;
  r.response_weights = m.response_weights;
  r.token_advantages = m.token_advantages;
  r.group_offsets = m.group_offsets;
  return r;
}

// A sweep of specs covering both layouts, masks, lengths 0/1, singletons and equal rewards.
inline std::vector<batch_spec> standard_specs() {
  std::vector<batch_spec> specs;
  for (int k = 0; k < 24; ++k) {
    batch_spec s;
    s.padded = k % 2 == 1;
    s.groups = 3 + k % 5;
    s.max_group = 1 + k % 8;
    s.max_length = 1 + (k * 7) % 17;
    s.binary_rewards = k % 3 != 2;
    s.masked_row = k % 4 == 0 ? 0.3 : 0.1;
    s.token_weights = k % 5 == 3;
    s.response_weights = true;
    specs.push_back(s);
  }
  return specs;
}

}  // namespace reco_test
