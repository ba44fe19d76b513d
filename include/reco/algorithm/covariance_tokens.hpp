// Clip-Cov / KL-Cov (reco/select/covariance.hpp) on the host: the per-token flags of the
// selected tokens, and KL-Cov's |logp - old_logp| term added after the token pass. Host-only:
// the selection is an O(N) nth_element over the call's valid tokens, which needs the final
// per-response advantages in host memory (CPU backends; the CUDA paths reject the selector).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/select/covariance.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Clip-Cov's reproducible order of the candidates: a seeded hash of the token's position in the
// call's token array (its rank among the candidates decides; ties, which need a 64-bit
// collision, go to the earlier token).
inline std::uint64_t covariance_subset_key(double seed, index_t t) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &seed, sizeof bits);
  return splitmix64(bits * 0xD1B54A32D192ED03ull ^ static_cast<std::uint64_t>(t));
}

// flags[t] = 1 for the selected tokens, 0 otherwise (N entries). Returns the number selected.
template <class Obj, class T>
index_t covariance_select(const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                          std::uint8_t* flags) {
  const auto& p = obj.select.params;
  const token_layout& L = b.layout;
  const index_t N = L.tokens;
  std::fill(flags, flags + N, std::uint8_t(0));

  // Means over the valid tokens (a response's advantage broadcast to its tokens unless given per
  // token).
  double n = 0, sum_a = 0, sum_l = 0;
  for (index_t i = 0; i < L.responses; ++i)
    for (index_t t = L.begin(i); t < L.end(i); ++t)
      if (b.valid(t)) {
        n += 1;
        sum_a += b.advantage_at(t, r.adv[i]);
        sum_l += static_cast<double>(b.logp[t]);
      }
  if (n == 0) return 0;
  const double mean_a = sum_a / n, mean_l = sum_l / n;
  index_t k = static_cast<index_t>(p.ratio * n);  // verl: int(ratio * N), at least 1
  if (k < 1) k = 1;

  struct scored {
    double cov;
    std::uint64_t key;
    index_t t;
  };
  std::vector<scored> cand;
  cand.reserve(static_cast<std::size_t>(n));
  const double limit = obj.ratio.params.log_ratio_clamp;
  for (index_t i = 0; i < L.responses; ++i) {
    for (index_t t = L.begin(i); t < L.end(i); ++t) {
      if (!b.valid(t)) continue;
      const double a = b.advantage_at(t, r.adv[i]);
      const double logp = static_cast<double>(b.logp[t]);
      const double cov = (a - mean_a) * (logp - mean_l);
      if (p.mode == covariance_mode::clip) {
        if (!(cov > p.lb && cov < p.ub)) continue;
        if constexpr (std::is_same_v<typename Obj::clip_type, ppo_clip>) {
          // verl's clip_by_origin: the clipped surrogate is the larger one.
          double l = b.old_logp ? logp - static_cast<double>(b.old_logp[t]) : 0.0;
          if (limit > 0) l = std::min(std::max(l, -limit), limit);
          const double x = std::exp(l);
          const double xc = std::min(std::max(x, 1.0 - obj.clip.params.eps_low), 1.0 + obj.clip.params.eps_high);
          if (-a * xc > -a * x) continue;
        }
        cand.push_back({cov, covariance_subset_key(p.seed, t), t});
      } else {
        cand.push_back({cov, 0, t});
      }
    }
  }
  const std::size_t take = std::min(static_cast<std::size_t>(k), cand.size());
  if (take < cand.size()) {
    if (p.mode == covariance_mode::clip)
      std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(take), cand.end(),
                       [](const scored& x, const scored& y) { return x.key != y.key ? x.key < y.key : x.t < y.t; });
    else  // the largest covariances; on equal values the earlier token wins
      std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(take), cand.end(),
                       [](const scored& x, const scored& y) { return x.cov != y.cov ? x.cov > y.cov : x.t < y.t; });
  }
  for (std::size_t j = 0; j < take; ++j) flags[cand[j].t] = 1;
  return static_cast<index_t>(take);
}

// KL-Cov: + coef |logp - old_logp| on the selected tokens' policy term, with the policy term's
// scale (aggregation coefficient, response weight, token weight). The subgradient at 0 is 0.
template <class Obj, class T>
void covariance_penalty(const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                        const std::uint8_t* flags, T* grad_logp, token_partial& tokens) {
  const double coef = obj.select.params.coef;
  const token_layout& L = b.layout;
  double loss = 0;
  for (index_t i = 0; i < L.responses; ++i) {
    const double scale_i = r.coef_policy[i] * r.weight[i];
    for (index_t t = L.begin(i); t < L.end(i); ++t) {
      if (!flags[t]) continue;
      const double d = b.old_logp ? static_cast<double>(b.logp[t]) - static_cast<double>(b.old_logp[t]) : 0.0;
      const double scale = b.token_weights ? scale_i * static_cast<double>(b.token_weights[t]) : scale_i;
      loss += scale * coef * std::fabs(d);
      const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
      grad_logp[t] = static_cast<T>(static_cast<double>(grad_logp[t]) + scale * coef * sign);
    }
  }
  tokens.policy += loss;
}

}  // namespace detail
RECO_NAMESPACE_END
