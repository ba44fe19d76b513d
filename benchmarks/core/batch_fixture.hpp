// A realistic benchmark batch: ragged responses (G = 8 per prompt, lengths spread around the
// mean), binary rewards, off-policy log-probs, about 5 % padding-free masked tokens.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "reco/batch.hpp"

namespace reco_bench {

using reco::index_t;

struct token_batch {
  index_t R = 0, N = 0;
  std::vector<index_t> offsets, groups;
  std::vector<float> logp, old_logp, ref_logp, entropy, rewards, grad;
  std::vector<std::uint8_t> mask;

  reco::batch_view<float> view() const {
    reco::batch_view<float> v;
    v.layout = reco::packed(reco::span<const index_t>(offsets));
    v.group_offsets = groups;
    v.logp = logp;
    v.old_logp = old_logp;
    v.ref_logp = ref_logp;
    v.entropy = entropy;
    v.mask = mask;
    v.rewards = rewards;
    return v;
  }
};

// About `tokens` tokens in responses of mean length `mean_length`, 8 per prompt.
inline token_batch make_token_batch(index_t tokens, index_t mean_length = 512, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> n(0.0f, 1.0f);
  token_batch b;
  b.offsets.push_back(0);
  b.groups.push_back(0);
  while (b.offsets.back() < tokens) {
    for (int j = 0; j < 8; ++j) {
      const index_t len = std::max<index_t>(1, static_cast<index_t>(mean_length * (0.25f + 1.5f * u(rng))));
      b.offsets.push_back(b.offsets.back() + len);
      b.rewards.push_back(u(rng) < 0.5f ? 1.0f : 0.0f);
    }
    b.groups.push_back(static_cast<index_t>(b.rewards.size()));
  }
  b.R = static_cast<index_t>(b.rewards.size());
  b.N = b.offsets.back();
  const auto N = static_cast<std::size_t>(b.N);
  b.logp.resize(N);
  b.old_logp.resize(N);
  b.ref_logp.resize(N);
  b.entropy.resize(N);
  b.mask.resize(N);
  b.grad.resize(N);
  for (std::size_t t = 0; t < N; ++t) {
    const float lp = -3.0f * u(rng) * u(rng);
    b.logp[t] = lp;
    b.old_logp[t] = std::min(lp + 0.1f * n(rng), 0.0f);
    b.ref_logp[t] = std::min(lp + 0.2f * n(rng), 0.0f);
    b.entropy[t] = 4.0f * u(rng);
    b.mask[t] = u(rng) < 0.95f ? 1 : 0;
  }
  return b;
}

}  // namespace reco_bench
