// Generalized advantage estimation (PPO with a critic; verl's gae estimator) on any token layout.
// Per response, backwards over its valid tokens t (masked tokens are skipped, so a multi-turn
// response's observation tokens neither break nor take part in the recursion):
//   delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lambda * A_next,   R_t = A_t + V_t
// where V_next and A_next belong to the next valid token of the same response (0 after the last).
// Masked tokens get A = R = 0 exactly (verl leaves carried values there; its losses mask them).
// Optionally A is whitened over every valid token of the batch as verl's masked_whiten does:
// (A - mean) / sqrt(var + eps) with the unbiased (n - 1) variance; R stays unwhitened.
#pragma once

#include <cmath>

#include "reco/algorithm/select_tokens.hpp"
#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/detail/math.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

struct gae_params {
  double gamma = 1.0;       // discount (verl's default)
  double lambda = 1.0;      // GAE lambda (verl's default)
  bool whiten = true;       // whiten the advantages over the batch's valid tokens (verl always does)
  double whiten_eps = 1e-8; // added to the variance under the square root (verl's)
};

namespace detail {

template <class T>
struct gae_fn {
  token_layout layout;
  const T* rewards;
  const T* values;
  const std::uint8_t* mask;
  double gamma, lambda;
  T* adv;
  T* ret;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    double next_value = 0, next_adv = 0;
    const index_t b = layout.begin(i);
    for (index_t t = layout.end(i); t-- > b;) {
      if (mask != nullptr && mask[t] == 0) {
        adv[t] = T(0);
        ret[t] = T(0);
        continue;
      }
      const double v = static_cast<double>(values[t]);
      const double delta = static_cast<double>(rewards[t]) + gamma * next_value - v;
      next_adv = delta + gamma * lambda * next_adv;
      next_value = v;
      adv[t] = static_cast<T>(next_adv);
      ret[t] = static_cast<T>(next_adv + v);
    }
  }
};

template <class T>
struct masked_value_fn {  // the value at a valid token, 0 elsewhere
  const T* x;
  const std::uint8_t* mask;
  RECO_HOST_DEVICE double operator()(index_t t) const {
    return (mask == nullptr || mask[t] != 0) ? static_cast<double>(x[t]) : 0.0;
  }
};

template <class T>
struct masked_square_fn {  // (x - mean)^2 at a valid token, 0 elsewhere
  const T* x;
  const std::uint8_t* mask;
  double mean;
  RECO_HOST_DEVICE double operator()(index_t t) const {
    if (mask != nullptr && mask[t] == 0) return 0.0;
    const double d = static_cast<double>(x[t]) - mean;
    return d * d;
  }
};

template <class T>
struct whiten_fn {
  T* x;
  const std::uint8_t* mask;
  double mean, scale;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    x[t] = (mask != nullptr && mask[t] == 0) ? T(0) : static_cast<T>((static_cast<double>(x[t]) - mean) * scale);
  }
};

template <class T>
struct outcome_token_fn {
  token_layout layout;
  const T* rewards;
  const std::uint8_t* mask;
  T* out;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const index_t b = layout.begin(i);
    bool placed = false;
    for (index_t t = layout.end(i); t-- > b;) {
      const bool valid = mask == nullptr || mask[t] != 0;
      out[t] = (valid && !placed) ? rewards[i] : T(0);
      placed = placed || valid;
    }
  }
};

// The layout with its token count: R * T when padded; packed, the length of the per-token array
// (as kl_reward.hpp), which the offsets index into.
inline token_layout with_tokens(token_layout layout, index_t per_token) {
  if (layout.kind == layout_kind::padded) layout.tokens = layout.responses * layout.max_length;
  else layout.tokens = per_token;
  return layout;
}

}  // namespace detail

// Spreads one outcome reward per response onto its last valid token (0 on every other token),
// the token_rewards that gae_advantages reads for outcome supervision. A response without a
// valid token drops its reward.
template <class Backend, class T>
void outcome_token_rewards(const Backend& be, const token_layout& layout, span<const T> rewards,
                           span<const std::uint8_t> mask, span<T> token_rewards) {
  const token_layout L = detail::with_tokens(layout, token_rewards.size());
  const index_t n = L.tokens;
  detail::require(rewards.size() == L.responses, "rewards", "needs one entry per response");
  detail::require(token_rewards.size() == n, "token_rewards", "needs one entry per token");
  detail::require(mask.empty() || mask.size() == n, "mask", "needs one entry per token");
  be.for_each(L.responses, detail::outcome_token_fn<T>{L, rewards.data(),
                                                            mask.empty() ? nullptr : mask.data(),
                                                            token_rewards.data()});
}

// Token-level GAE advantages and returns (see the top of this header). Every per-token array has
// one entry per token of the layout; mask may be empty (every token valid). Rewards and values
// at masked tokens are not read. Errors name the argument: gamma or lambda outside [0, 1], a
// NaN or infinite reward or value at a valid token, whitening with fewer than 2 valid tokens.
template <class Backend, class T>
void gae_advantages(const Backend& backend, const token_layout& layout, span<const T> token_rewards,
                    span<const T> values, span<const std::uint8_t> mask, const gae_params& p, span<T> advantages,
                    span<T> returns, workspace<Backend>& ws) {
  detail::require(detail::finite(p.gamma) && p.gamma >= 0 && p.gamma <= 1, "params.gamma", "must be in [0, 1]");
  detail::require(detail::finite(p.lambda) && p.lambda >= 0 && p.lambda <= 1, "params.lambda", "must be in [0, 1]");
  detail::require(detail::finite(p.whiten_eps) && p.whiten_eps >= 0, "params.whiten_eps", "must be finite and >= 0");
  const token_layout L = detail::with_tokens(layout, token_rewards.size());
  const index_t n = L.tokens;
  detail::require(token_rewards.size() == n, "token_rewards", "needs one entry per token");
  detail::require(values.size() == n, "values", "needs one entry per token");
  detail::require(mask.empty() || mask.size() == n, "mask", "needs one entry per token");
  detail::require(advantages.size() == n, "advantages", "needs one entry per token");
  detail::require(returns.size() == n, "returns", "needs one entry per token");
  const std::uint8_t* m = mask.empty() ? nullptr : mask.data();
  const Backend be = ws.bind(backend);
  detail::carver measure(nullptr);
  measure.take<double>(1);
  detail::carver carve(ws.reserve(be, measure.used()));
  double* acc = carve.take<double>(1);
  if (n > 0) {
    be.reduce(n, detail::count_nonfinite_fn<T>{token_rewards.data(), m}, detail::sum_fn{}, acc);
    if (be.read(acc) > 0) detail::fail("token_rewards", "NaN or infinite value in a valid token");
    be.reduce(n, detail::count_nonfinite_fn<T>{values.data(), m}, detail::sum_fn{}, acc);
    if (be.read(acc) > 0) detail::fail("values", "NaN or infinite value in a valid token");
  }
  be.for_each(L.responses, detail::gae_fn<T>{L, token_rewards.data(), values.data(), m, p.gamma, p.lambda,
                                                  advantages.data(), returns.data()});
  if (!p.whiten) return;
  double count = 0;
  if (n > 0) {
    be.reduce(n, detail::count_valid_fn{m}, detail::sum_fn{}, acc);
    count = be.read(acc);
  }
  detail::require(count >= 2, "mask", "whitening needs at least 2 valid tokens");
  be.reduce(n, detail::masked_value_fn<T>{advantages.data(), m}, detail::sum_fn{}, acc);
  const double mean = be.read(acc) / count;
  be.reduce(n, detail::masked_square_fn<T>{advantages.data(), m, mean}, detail::sum_fn{}, acc);
  const double var = be.read(acc) / (count - 1);
  const double denom = std::sqrt(var + p.whiten_eps);
  // var + eps = 0 only when every advantage equals the mean: each deviation is exactly 0.
  const double scale = denom > 0 ? 1.0 / denom : 0.0;
  be.for_each(n, detail::whiten_fn<T>{advantages.data(), m, mean, scale});
}

RECO_NAMESPACE_END
