// verl's optimal token baseline (OTB): a baseline per token position shared by a prompt's group,
// weighted by a cumulative path-variance proxy. For response i and position p (p counts from the
// response's first token, masked tokens included, as the columns of verl's padded layout):
//   G_i(p) = sum of r over the valid tokens at positions >= p           (reward to go)
//   w_i(p) = (1 - 2 exp(old_logp) + sum_pi_squared) * rho^2             (rho = rollout IS weight, or 1)
//   W_i(p) = sum of w over the valid tokens at positions <= p
//   B(p)   = sum_i m_i(p) G_i(p) W_i(p) / (sum_i m_i(p) W_i(p) + eps)   over the group
//   A_i(p) = (G_i(p) - B(p)) m_i(p),  returns G_i(p) m_i(p)
// A group of one gets B = 0. valid_positions gives verl's multi-turn variant (see the params).
// With zero_tail, a group whose longest response is unique and longer than the others gets B = 0
// past the second-longest length (lengths = valid-token counts).
#pragma once

#include "reco/algorithm/select_tokens.hpp"
#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/detail/math.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

struct optimal_token_baseline_params {
  double eps = 1e-8;       // added to the baseline's denominator (verl's)
  bool zero_tail = false;  // verl's handle_zero_tail (default false; true in its multi-turn variant)
  // false: p counts every token from the response's start (verl's optimal_token_baseline);
  // true: p counts the valid tokens only and responses without one leave their group (verl's
  // multi-turn tir_optimal_token_baseline, where observation tokens sit between turns).
  bool valid_positions = false;
};

namespace detail {

template <class T>
struct otb_group_fn {
  token_layout layout;
  const index_t* groups;
  const T* rewards;
  const T* old_logp;
  const T* sum_pi_sq;
  const T* is_weights;  // may be null
  const std::uint8_t* mask;
  optimal_token_baseline_params p;
  T* adv;        // holds W until the baseline is known
  T* ret;
  double* num;   // per-position sums, at the group's first token offset (a group spans at least
  double* den;   // as many tokens as its longest response)
  RECO_HOST_DEVICE bool valid(index_t t) const { return mask == nullptr || mask[t] != 0; }
  RECO_HOST_DEVICE void operator()(index_t g) const {
    const index_t first = groups[g], last = groups[g + 1];
    const index_t base_at = layout.begin(first);
    index_t span_max = 0, longest = -1, second_len = 0, longest_len = -1, members = 0;
    bool unique = false;
    for (index_t i = first; i < last; ++i) {
      const index_t b = layout.begin(i), e = layout.end(i);
      span_max = e - b > span_max ? e - b : span_max;
      double to_go = 0;
      for (index_t t = e; t-- > b;) {
        if (valid(t)) to_go += static_cast<double>(rewards[t]);
        ret[t] = valid(t) ? static_cast<T>(to_go) : T(0);
      }
      double w_sum = 0;
      index_t len = 0;
      for (index_t t = b; t < e; ++t) {
        if (valid(t)) {
          double w = 1.0 - 2.0 * ::exp(static_cast<double>(old_logp[t])) + static_cast<double>(sum_pi_sq[t]);
          if (is_weights != nullptr) w *= static_cast<double>(is_weights[t]) * static_cast<double>(is_weights[t]);
          w_sum += w;
          ++len;
        }
        adv[t] = static_cast<T>(w_sum);
      }
      if (p.valid_positions && len == 0) continue;  // not a member of its group
      ++members;
      if (len > longest_len) {
        second_len = longest_len < 0 ? 0 : longest_len;
        longest_len = len;
        longest = i;
        unique = true;
      } else {
        if (len == longest_len) unique = false;
        second_len = len > second_len ? len : second_len;
      }
    }
    // Offsets that decrease (a caller's error) could reach past the buffer: stay inside it.
    const index_t room = layout.tokens - base_at;
    if (span_max > room) span_max = room;
    for (index_t j = 0; j < span_max; ++j) num[base_at + j] = den[base_at + j] = 0;
    for (index_t i = first; i < last; ++i) {
      index_t j = 0;
      for (index_t t = layout.begin(i); t < layout.end(i); ++t, ++j) {
        if (!valid(t)) {
          if (p.valid_positions) --j;
          continue;
        }
        if (j >= span_max) break;
        num[base_at + j] += static_cast<double>(ret[t]) * static_cast<double>(adv[t]);
        den[base_at + j] += static_cast<double>(adv[t]);
      }
    }
    const bool single = members == 1;
    const bool tail_on = p.zero_tail && members > 1 && unique;
    for (index_t i = first; i < last; ++i) {
      index_t j = 0;
      for (index_t t = layout.begin(i); t < layout.end(i); ++t, ++j) {
        if (!valid(t)) {
          adv[t] = T(0);
          if (p.valid_positions) --j;
          continue;
        }
        if (j >= span_max) {
          adv[t] = T(0);
          continue;
        }
        const bool tail = tail_on && i == longest && j >= second_len;
        const double base = (single || tail) ? 0.0 : num[base_at + j] / (den[base_at + j] + p.eps);
        adv[t] = static_cast<T>(static_cast<double>(ret[t]) - base);
      }
    }
  }
};

struct bad_group_fn {
  const index_t* groups;
  index_t P, R;
  RECO_HOST_DEVICE double operator()(index_t g) const {
    const bool bad = groups[g + 1] <= groups[g] || (g == 0 && groups[0] != 0) || (g == P - 1 && groups[P] != R);
    return bad ? 1.0 : 0.0;
  }
};

}  // namespace detail

// Token-level OTB advantages and returns. Per-token arrays (token_rewards, old_logp,
// sum_pi_squared, is_weights when given, mask when given, advantages, returns) have one entry per
// token of the layout; group_offsets has P + 1 entries over the responses. Errors name the
// argument: sizes, malformed group offsets (an empty group included), NaN or infinite inputs at
// valid tokens, eps < 0.
template <class Backend, class T>
void optimal_token_baseline_advantages(const Backend& backend, const token_layout& layout,
                                       span<const index_t> group_offsets, span<const T> token_rewards,
                                       span<const T> old_logp, span<const T> sum_pi_squared, span<const T> is_weights,
                                       span<const std::uint8_t> mask, const optimal_token_baseline_params& p,
                                       span<T> advantages, span<T> returns, workspace<Backend>& ws) {
  detail::require(detail::finite(p.eps) && p.eps >= 0, "params.eps", "must be finite and >= 0");
  token_layout L = layout;
  L.tokens = layout.kind == layout_kind::padded ? layout.responses * layout.max_length : token_rewards.size();
  const index_t n = L.tokens;
  detail::require(token_rewards.size() == n, "token_rewards", "needs one entry per token");
  detail::require(old_logp.size() == n, "old_logp", "needs one entry per token");
  detail::require(sum_pi_squared.size() == n, "sum_pi_squared", "needs one entry per token");
  detail::require(is_weights.empty() || is_weights.size() == n, "is_weights", "needs one entry per token");
  detail::require(mask.empty() || mask.size() == n, "mask", "needs one entry per token");
  detail::require(advantages.size() == n, "advantages", "needs one entry per token");
  detail::require(returns.size() == n, "returns", "needs one entry per token");
  detail::require(group_offsets.size() >= 1, "group_offsets", "needs P + 1 entries (at least {0})");
  const index_t P = group_offsets.size() - 1;
  const std::uint8_t* m = mask.empty() ? nullptr : mask.data();
  const Backend be = ws.bind(backend);
  detail::carver measure(nullptr);
  measure.take<double>(1);
  measure.take<double>(n);
  measure.take<double>(n);
  detail::carver carve(ws.reserve(be, measure.used()));
  double* bad = carve.take<double>(1);
  double* num = carve.take<double>(n);
  double* den = carve.take<double>(n);
  // Checked where the offsets live (device memory on CUDA): a bad first or last offset or an
  // empty group (a baseline over no response) is an error.
  if (P > 0) {
    be.reduce(P, detail::bad_group_fn{group_offsets.data(), P, L.responses}, detail::sum_fn{}, bad);
    if (be.read(bad) > 0)
      detail::fail("group_offsets", "must rise strictly from 0 to the number of responses (no empty group)");
  } else {
    detail::require(L.responses == 0, "group_offsets", "has no group for the responses");
  }
  if (n > 0) {
    auto check = [&](span<const T> x, const char* name) {
      if (x.empty()) return;
      be.reduce(n, detail::count_nonfinite_fn<T>{x.data(), m}, detail::sum_fn{}, bad);
      if (be.read(bad) > 0) detail::fail(name, "NaN or infinite value in a valid token");
    };
    check(token_rewards, "token_rewards");
    check(old_logp, "old_logp");
    check(sum_pi_squared, "sum_pi_squared");
    check(is_weights, "is_weights");
  }
  be.for_each(P, detail::otb_group_fn<T>{L, group_offsets.data(), token_rewards.data(), old_logp.data(),
                                         sum_pi_squared.data(), is_weights.empty() ? nullptr : is_weights.data(), m,
                                         p, advantages.data(), returns.data(), num, den});
}

RECO_NAMESPACE_END
