// Rollout (train-inference) importance-sampling correction. The inference engine that sampled the
// batch (the rollout policy mu) and the trainer's recomputation of the same policy (old_logp)
// disagree; per valid token t of response i, with the log ratio
//   l_t = clamp(old_logp_t - rollout_logp_t, -B, B)        (B = log_ratio_bound; inf: no clamp)
// this computes
//   * importance weights rho (to pass as batch.token_weights / Python token_weights=):
//       token level     rho_t = exp(l_t)
//       sequence level  rho_t = exp(clamp(sum_{valid s in i} (old_logp_s - rollout_logp_s), -B, B))
//     bounded to [lower, upper] by truncation (TIS: min(max(rho, lower), upper)) or by masking
//     (MIS / IcePop: rho outside [lower, upper] becomes 0), and optionally divided by their batch
//     mean (token level: the mean over valid tokens; sequence level: the mean over responses with
//     a valid token of each response's mean weight);
//   * a rejection mask: the input mask AND every filter's verdict. A filter bounds a statistic
//     built from the per-token KL estimators of KL(mu || pi_old) (clamped l_t as above):
//       k1 = -l_t,   k2 = l_t^2 / 2,   k3 = exp(l_t) - 1 - l_t
//     at token level (token_k*: the token is dropped) or over the response's valid tokens
//     (seq_sum_k*, seq_mean_k*, seq_max_k*: the whole response is dropped), kept when
//     lower <= statistic <= upper. With negative_advantages_only a response whose advantage is
//     >= 0 is never dropped by that filter (TRL's off-policy sequence mask).
// Masked tokens get weight 0 and stay masked. Weights are computed on the input mask (a rejected
// token keeps its weight; the caller ANDs the mask in), as verl does.
//
// Peers as settings (docs/batch_ops.md has the table): verl's rollout_is / rollout_rs (B = 20,
// count_eps = 1e-8; its k1 "lower_upper" ratio bounds are log(lower), log(upper) on k1), TRL's
// vllm_importance_sampling_mode and off_policy_mask_threshold, OpenRLHF's tis / icepop /
// seq-mask-tis (B = inf).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

enum class rollout_is_level : std::uint8_t {
  none,      // no weights (every valid token gets 1); only the filters act
  token,     // rho_t = exp(l_t)
  sequence,  // rho_t = exp(sum of the response's log ratios), the same for all its tokens
};

enum class rollout_is_bound : std::uint8_t {
  truncate,  // TIS: clamp rho into [lower, upper]
  mask,      // MIS / IcePop: rho outside [lower, upper] becomes 0
};

enum class rollout_statistic : std::uint8_t {
  token_k1, token_k2, token_k3,
  seq_sum_k1, seq_sum_k2, seq_sum_k3,
  seq_mean_k1, seq_mean_k2, seq_mean_k3,
  seq_max_k1, seq_max_k2, seq_max_k3,
};

// One rejection filter: keep where lower <= statistic <= upper (k1 is a log ratio: verl's ratio
// bounds [a, b] on a k1 statistic are lower = log a, upper = log b).
struct rollout_filter {
  rollout_statistic statistic = rollout_statistic::token_k1;
  double lower = -std::numeric_limits<double>::infinity();
  double upper = std::numeric_limits<double>::infinity();
  bool negative_advantages_only = false;  // a response with advantage >= 0 always passes this filter
};

struct rollout_correction_params {
  rollout_is_level level = rollout_is_level::token;
  rollout_is_bound bound = rollout_is_bound::truncate;
  double lower = 0.0;             // truncate: raise weights below it (0: none); mask: zero them
  double upper = 2.0;             // truncate: cap; mask: zero above it (inf: no upper bound)
  double log_ratio_bound = 20.0;  // B (verl's safety bound); inf: no clamp (TRL, OpenRLHF)
  bool normalise = false;         // divide the weights by their batch mean (verl's batch_normalize)
  double count_eps = 0.0;         // added to token counts in the per-response means (verl: 1e-8)
};

// Diagnostics over the input's valid tokens (zeros for a batch without one).
struct rollout_correction_metrics {
  index_t valid_tokens = 0;
  index_t valid_responses = 0;     // responses with at least one valid token
  double weight_mean = 0;          // weights after the bound, before normalisation
  double weight_min = 0;
  double weight_max = 0;
  double bounded_fraction = 0;     // valid tokens whose weight the bound changed (truncated or zeroed)
  double normaliser = 1;           // what the weights were divided by (1 without normalise)
  double rejected_token_fraction = 0;     // valid tokens the filters dropped
  double rejected_response_fraction = 0;  // valid responses that lost at least one token
  double k1_mean = 0;              // mean of rollout_logp - old_logp: an estimate of KL(mu || pi_old)
  double k3_mean = 0;              // mean of k3 (unclamped log ratio)
};

namespace detail {

inline double rollout_clamp(double x, double b) { return x < -b ? -b : (x > b ? b : x); }

inline double rollout_k(int k, double l) {
  if (k == 1) return -l;
  if (k == 2) return 0.5 * l * l;
  return ::expm1(l) - l;
}

inline void check_rollout_params(const rollout_correction_params& p, span<const rollout_filter> filters) {
  require(static_cast<int>(p.level) <= 2, "params.level", "must be none, token or sequence");
  require(static_cast<int>(p.bound) <= 1, "params.bound", "must be truncate or mask");
  require(p.upper == p.upper && p.upper > 0, "params.upper", "must be > 0 (inf: no upper bound)");
  require(std::isfinite(p.lower) && p.lower >= 0, "params.lower", "must be finite and >= 0");
  require(p.lower <= p.upper, "params.lower", "must be <= params.upper");
  require(p.log_ratio_bound == p.log_ratio_bound && p.log_ratio_bound > 0, "params.log_ratio_bound",
          "must be > 0 (inf: no clamp)");
  require(std::isfinite(p.count_eps) && p.count_eps >= 0, "params.count_eps", "must be finite and >= 0");
  for (index_t f = 0; f < filters.size(); ++f) {
    const rollout_filter& r = filters[f];
    const std::string name = "filters[" + std::to_string(f) + "]";
    require(static_cast<int>(r.statistic) <= static_cast<int>(rollout_statistic::seq_max_k3), name + ".statistic",
            "unknown statistic");
    require(r.lower == r.lower, name + ".lower", "must not be NaN");
    require(r.upper == r.upper, name + ".upper", "must not be NaN");
    require(r.lower <= r.upper, name + ".lower", "must be <= upper");
  }
}

}  // namespace detail

// Fills weights (one per token, may be empty: not computed) and keep_mask (one per token, may be
// empty: not computed; may alias nothing else) and returns the diagnostics. mask may be empty
// (every token in range valid). advantages (one per response) is required exactly when a filter
// has negative_advantages_only. Errors name the argument: sizes, a NaN, infinite or positive
// log-probability at a valid token, parameters out of range (see check_rollout_params).
template <class T>
rollout_correction_metrics rollout_importance_weights(const token_layout& layout, span<const T> old_logp,
                                                      span<const T> rollout_logp, span<const std::uint8_t> mask,
                                                      span<const T> advantages,
                                                      const rollout_correction_params& p,
                                                      span<const rollout_filter> filters, span<T> weights,
                                                      span<std::uint8_t> keep_mask) {
  detail::check_rollout_params(p, filters);
  token_layout L = layout;
  L.tokens = layout.kind == layout_kind::padded ? layout.responses * layout.max_length : old_logp.size();
  const index_t n = L.tokens, R = L.responses;
  detail::require(old_logp.size() == n, "old_logp", "needs one entry per token");
  detail::require(rollout_logp.size() == n, "rollout_logp", "needs one entry per token");
  detail::require(mask.empty() || mask.size() == n, "mask", "needs one entry per token");
  detail::require(weights.empty() || weights.size() == n, "weights", "needs one entry per token");
  detail::require(keep_mask.empty() || keep_mask.size() == n, "keep_mask", "needs one entry per token");
  if (L.kind == layout_kind::packed) {
    detail::require(L.offsets.size() == R + 1 && (R + 1 == 0 || L.offsets[0] == 0), "offsets",
                    "needs R + 1 entries starting at 0");
    for (index_t i = 0; i < R; ++i)
      detail::require(L.offsets[i + 1] >= L.offsets[i], "offsets", "must not decrease");
    detail::require(R == 0 || L.offsets[R] == n, "offsets", "must end at the number of tokens");
  }
  bool need_adv = false;
  for (index_t f = 0; f < filters.size(); ++f) need_adv = need_adv || filters[f].negative_advantages_only;
  if (need_adv)
    detail::require(advantages.size() == R, "advantages", "needs one entry per response (a filter reads them)");
  else
    detail::require(advantages.empty(), "advantages", "given but no filter has negative_advantages_only");
  for (index_t i = 0; i < advantages.size(); ++i)
    detail::require(std::isfinite(static_cast<double>(advantages[i])), "advantages", "NaN or infinite value");
  auto valid = [&](index_t t) { return mask.empty() || mask[t] != 0; };
  auto log_ratio = [&](index_t t) { return static_cast<double>(old_logp[t]) - static_cast<double>(rollout_logp[t]); };
  for (index_t t = 0; t < n; ++t) {
    if (!valid(t)) continue;
    const double a = static_cast<double>(old_logp[t]), b = static_cast<double>(rollout_logp[t]);
    if (!(std::isfinite(a) && a <= 0)) detail::fail("old_logp", "a valid token is NaN, infinite or positive");
    if (!(std::isfinite(b) && b <= 0)) detail::fail("rollout_logp", "a valid token is NaN, infinite or positive");
  }

  const double B = p.log_ratio_bound;
  rollout_correction_metrics m;
  double w_sum = 0, k1_sum = 0, k3_sum = 0, seq_mean_sum = 0;
  index_t bounded = 0, rejected = 0, rejected_responses = 0;
  bool first = true;
  for (index_t i = 0; i < R; ++i) {
    const index_t b = L.begin(i), e = L.end(i);
    index_t len = 0;
    double lsum = 0;
    for (index_t t = b; t < e; ++t)
      if (valid(t)) {
        ++len;
        lsum += log_ratio(t);
      }
    const double seq_raw = ::exp(detail::rollout_clamp(lsum, B));
    // Weights.
    double resp_w_sum = 0;
    for (index_t t = b; t < e; ++t) {
      if (!valid(t)) {
        if (!weights.empty()) weights[t] = T(0);
        continue;
      }
      const double l = log_ratio(t);
      k1_sum += -l;
      k3_sum += ::expm1(l) - l;
      double w = 1.0;
      if (p.level != rollout_is_level::none) {
        const double raw = p.level == rollout_is_level::token ? ::exp(detail::rollout_clamp(l, B)) : seq_raw;
        if (p.bound == rollout_is_bound::truncate) w = raw < p.lower ? p.lower : (raw > p.upper ? p.upper : raw);
        else w = (raw >= p.lower && raw <= p.upper) ? raw : 0.0;
        if (w != raw) ++bounded;
      }
      w_sum += w;
      resp_w_sum += w;
      if (first || w < m.weight_min) m.weight_min = w;
      if (first || w > m.weight_max) m.weight_max = w;
      first = false;
      if (!weights.empty()) weights[t] = static_cast<T>(w);
    }
    if (len > 0) {
      ++m.valid_responses;
      seq_mean_sum += resp_w_sum / (static_cast<double>(len) + p.count_eps);
    }
    m.valid_tokens += len;
    // Filters.
    bool response_kept = true;  // by the sequence-level filters
    for (index_t f = 0; f < filters.size(); ++f) {
      const rollout_filter& r = filters[f];
      const int s = static_cast<int>(r.statistic);
      if (s < 3) continue;
      const int k = s % 3 + 1;
      double stat = 0;
      bool any = false;
      for (index_t t = b; t < e; ++t) {
        if (!valid(t)) continue;
        const double l = detail::rollout_clamp(log_ratio(t), B);
        const double v = detail::rollout_k(k, l);
        if (s >= 9) stat = any ? (v > stat ? v : stat) : v;
        else stat += v;
        any = true;
      }
      if (s >= 6 && s < 9) stat = len > 0 ? stat / (static_cast<double>(len) + p.count_eps) : 0.0;
      const bool exempt = r.negative_advantages_only && static_cast<double>(advantages[i]) >= 0;
      if (!exempt && !(stat >= r.lower && stat <= r.upper)) response_kept = false;
    }
    bool lost = false;
    for (index_t t = b; t < e; ++t) {
      bool keep = valid(t);
      if (keep) {
        keep = response_kept;
        const double l = detail::rollout_clamp(log_ratio(t), B);
        for (index_t f = 0; f < filters.size() && keep; ++f) {
          const rollout_filter& r = filters[f];
          const int s = static_cast<int>(r.statistic);
          if (s >= 3) continue;
          const double v = detail::rollout_k(s + 1, l);
          const bool exempt = r.negative_advantages_only && static_cast<double>(advantages[i]) >= 0;
          if (!exempt && !(v >= r.lower && v <= r.upper)) keep = false;
        }
        if (!keep) {
          ++rejected;
          lost = true;
        }
      }
      if (!keep_mask.empty()) keep_mask[t] = keep ? 1 : 0;
    }
    if (lost) ++rejected_responses;
  }
  if (m.valid_tokens > 0) {
    const double nt = static_cast<double>(m.valid_tokens);
    m.weight_mean = w_sum / nt;
    m.bounded_fraction = static_cast<double>(bounded) / nt;
    m.rejected_token_fraction = static_cast<double>(rejected) / nt;
    m.rejected_response_fraction = static_cast<double>(rejected_responses) / static_cast<double>(m.valid_responses);
    m.k1_mean = k1_sum / nt;
    m.k3_mean = k3_sum / nt;
  }
  if (p.normalise && p.level != rollout_is_level::none && m.valid_tokens > 0) {
    const double mean = p.level == rollout_is_level::token
                            ? w_sum / (static_cast<double>(m.valid_tokens) + p.count_eps)
                            : seq_mean_sum / static_cast<double>(m.valid_responses);
    // A mean of 0 (every weight zeroed by the mask bound) leaves the weights as they are.
    if (mean > 0) {
      m.normaliser = mean;
      if (!weights.empty())
        for (index_t t = 0; t < n; ++t) weights[t] = static_cast<T>(static_cast<double>(weights[t]) / mean);
    }
  }
  return m;
}

RECO_NAMESPACE_END
