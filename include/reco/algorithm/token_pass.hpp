// The per-token pass: the loops that load each token, call the token body (token_body.hpp: its
// loss contribution, gradient and diagnostics) and add up what it returns, one token at a time or
// on SIMD packs; plus the single-thread steps around it (aggregation counts before, the result
// after).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/component.hpp"
#include "reco/detail/math.hpp"
#include "reco/result.hpp"
#include "reco/select/covariance.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Single-thread step: the counts every aggregator normalises by, with global overrides.
template <class Obj>
struct counts_fn {
  objective_scalars* s;
  normalisers norm;
  token_layout layout;
  bool kept_denominator;
  RECO_HOST_DEVICE void operator()(index_t) const {
    const double lmax = layout.kind == layout_kind::padded ? static_cast<double>(layout.max_length)
                                                            : s->batch.longest;
    aggregation_counts v;
    v.tokens = norm.tokens > 0 ? static_cast<double>(norm.tokens) : s->batch.tokens;
    v.responses = norm.responses > 0 ? static_cast<double>(norm.responses) : s->batch.nonempty;
    v.all_responses = static_cast<double>(layout.responses);
    v.max_length = lmax;
    s->valid = v;
    aggregation_counts p = v;
    if (kept_denominator) {
      p.tokens = norm.kept_tokens > 0 ? static_cast<double>(norm.kept_tokens) : s->responses.kept_tokens;
      p.responses =
          norm.kept_responses > 0 ? static_cast<double>(norm.kept_responses) : s->responses.kept_nonempty;
    }
    s->policy = p;
    // A global count covers this call's part of the step, so one below the local count is the
    // caller's error (it would silently scale the loss up). Assigned, not accumulated: the last
    // call, with the final kept counts, decides.
    std::uint32_t st = 0;
    if (norm.tokens > 0 && static_cast<double>(norm.tokens) < s->batch.tokens) st |= bad_normaliser_tokens;
    if (norm.responses > 0 && static_cast<double>(norm.responses) < s->batch.nonempty) st |= bad_normaliser_responses;
    if (kept_denominator && norm.kept_tokens > 0 && static_cast<double>(norm.kept_tokens) < s->responses.kept_tokens)
      st |= bad_normaliser_kept_tokens;
    if (kept_denominator && norm.kept_responses > 0 &&
        static_cast<double>(norm.kept_responses) < s->responses.kept_nonempty)
      st |= bad_normaliser_kept_responses;
    s->norm_status = st;
  }
};

// Per response: the aggregation coefficients, so that the token pass does no division.
template <class Obj>
struct coefficients_fn {
  Obj obj;
  response_scratch r;
  const objective_scalars* s;
  bool kept_denominator;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    r.coef_valid[i] = obj.aggregate.coefficient(s->valid, r.length[i]);
    r.coef_policy[i] = obj.aggregate.coefficient(s->policy, kept_denominator ? r.kept[i] : r.length[i]);
  }
};


// What the token pass reads once per response.
struct response_values {
  double advantage = 0;
  double sequence_log_ratio = 0;
  double entropy_quantile = 0;
  double policy_scale = 0;  // policy aggregation coefficient times the response weight
  double coef = 0;          // aggregation coefficient of the KL / entropy terms
  // Thirds of the valid span: third k holds d = t - first with floor(3 d / span) == k, i.e.
  // d >= ceil(k span / 3) (a division by the constant 3, not by span, per response).
  index_t cut1 = 0, cut2 = 0;
  index_t first = -1, last = -1;  // first and last valid position (-1: none)
};

template <class Obj, class T>
struct token_fn {
  Obj obj;
  batch_pointers<T> b;
  response_scratch r;
  const std::uint8_t* kept;  // null: every valid token is a policy token
  const objective_scalars* s;
  T* grad_logp;
  T* grad_entropy;  // null unless an entropy term is on
  bool kept_denominator;
  // false: the token diagnostics (clip and dual counts, ppo_kl, the ratio's mean / min / max, the
  // entropy means, the token variances) are neither computed nor accumulated; they read 0.
  bool diagnostics = true;
  // The value checks this pass makes (those the response scan left to it: scan_response_fn's
  // `deferred`), into token_partial::status.
  token_checks checks{false, false, false, false, false};
  // Valid tokens that leave the policy term, by position, ascending: a selection that removes a
  // few tokens (Clip-Cov) names them here instead of writing a kept flag for every token.
  const index_t* removed = nullptr;
  index_t removed_count = 0;
  // The pass computes each response's weight from the mean it sums itself (a host backend's packed
  // pass, weight_in_token_pass: old_logp is then read from memory once); it writes r.weight and
  // r.capped of the responses whose first valid token it holds.
  bool weighs = false;

  // What the objective's selector can hand the pass: kept flags (an entropy or 80/20 selection) or
  // a list of removed tokens (Clip-Cov). A pass for an objective without a selection compiles no
  // per-token test of either.
  using selector_type = typename Obj::selector_type;
  static constexpr bool may_keep = selector_type::active && !is_covariance_selection_v<selector_type>;
  static constexpr bool may_remove = is_covariance_selection_v<selector_type>;
  // Whether a selection decides the policy tokens (else every valid token is one).
  RECO_HOST_DEVICE bool selects() const {
    return (may_keep && kept != nullptr) || (may_remove && removed_count > 0);
  }
  // The first removed position at or after t (a lower bound written out: std::lower_bound is not
  // callable from the device code this struct also compiles into, where the list is empty).
  RECO_HOST_DEVICE const index_t* removed_from(index_t t) const {
    const index_t* lo = removed;
    index_t n = removed_count;
    while (n > 0) {  // lower bound
      const index_t half = n / 2;
      if (lo[half] < t) {
        lo += half + 1;
        n -= half + 1;
      } else {
        n = half;
      }
    }
    return lo;
  }

  // Whether the pass reads the entropies: given, and read by the diagnostics (with `diag`), the
  // entropy term, an entropy-split clip or the value checks. A call given them only for its
  // diagnostics, with the diagnostics off, does not read them.
  RECO_HOST_DEVICE bool reads_entropy(bool diag) const {
    return b.entropy != nullptr && (diag || term_on(obj.entropy) || clip_needs_entropy(obj.clip) || checks.entropy);
  }

  // Response i's weight w_i from the sum of its old log-probabilities (token_fn::weighs), capped
  // as the group pass caps it; the part of the pass that holds its first valid token (`owner`)
  // writes it to r.weight and r.capped.
  RECO_HOST_DEVICE double weight_from_sum(index_t i, double old_sum, bool owner) const {
    const index_t n = r.length[i];
    std::uint8_t capped = 0;
    const response_context ctx = weight_context(b, n, old_mean_of(old_sum, n), r.group_size[i], i);
    const double w = capped_weight(obj.weight, ctx, capped);
    if (owner) {
      r.weight[i] = w;
      r.capped[i] = capped;
    }
    return w;
  }

  RECO_HOST_DEVICE response_values response(index_t i) const { return response(i, r.weight[i]); }
  // With the response's weight w_i given (token_fn::weighs).
  RECO_HOST_DEVICE response_values response(index_t i, double weight) const {
    response_values v;
    v.advantage = r.adv[i];
    v.sequence_log_ratio = r.seq_log ? r.seq_log[i] : 0.0;
    v.entropy_quantile = r.entropy_q ? r.entropy_q[i] : 0.0;
    const index_t n = r.length[i];
    const double coef_policy = r.coef_policy
                                   ? r.coef_policy[i]
                                   : obj.aggregate.coefficient(s->policy, kept_denominator ? r.kept[i] : n);
    v.policy_scale = coef_policy * weight;
    v.coef = r.coef_valid ? r.coef_valid[i] : obj.aggregate.coefficient(s->valid, n);
    const index_t first = r.first[i], span_len = r.last[i] - first + 1;
    v.cut1 = first + (span_len + 2) / 3;
    v.cut2 = first + (2 * span_len + 2) / 3;
    v.first = first;
    v.last = r.last[i];
    return v;
  }

  // Adds the tokens [t0, t1) of response i to p and writes their gradients, one token at a time
  // in double: the CPU's scalar path (the device path runs the same body, token_step.hpp).
  RECO_HOST_DEVICE void accumulate_range(token_partial& p, index_t i, index_t t0, index_t t1) const {
    const response_values v = response(i);
    const double adv = v.advantage;
    const bool kl_on = term_on(obj.kl);
    const bool check = checks.any();
    const T* entropy = reads_entropy(diagnostics) ? b.entropy : nullptr;
    const index_t* next_removed = removed_from(t0);
    const index_t* const removed_end = removed + removed_count;
    token_faults<double> faults;

    for (index_t t = t0; t < t1; ++t) {
      if (!b.valid(t)) {
        grad_logp[t] = T(0);
        if (grad_entropy) grad_entropy[t] = T(0);
        continue;
      }
      token_context c;
      c.logp = static_cast<double>(b.logp[t]);
      c.old_logp = b.old_logp ? static_cast<double>(b.old_logp[t]) : c.logp;
      c.entropy = entropy ? static_cast<double>(entropy[t]) : 0.0;
      c.advantage = b.advantage_at(t, adv);
      c.sequence_log_ratio = v.sequence_log_ratio;
      c.entropy_quantile = v.entropy_quantile;
      bool keep = !may_keep || kept == nullptr || kept[t];
      if constexpr (may_remove) {
        while (next_removed != removed_end && *next_removed < t) ++next_removed;
        if (next_removed != removed_end && *next_removed == t) {
          keep = false;
          ++next_removed;
        }
      }
      const double ref = kl_on || checks.ref_logp ? static_cast<double>(b.ref_logp[t]) : 0.0;
      if (check)
        token_value_checks(faults, checks, true, c.logp, c.old_logp, ref, c.entropy,
                           checks.token_weights ? static_cast<double>(b.token_weights[t]) : 0.0);
      const double scale =
          b.token_weights ? v.policy_scale * static_cast<double>(b.token_weights[t]) : v.policy_scale;
      if (diagnostics) set_logp_variance(c, true);  // the diagnostic's, read by ReCo's ratio too
      const token_terms<double> k = token_body(obj, c, true, keep, ref, scale, v.coef);

      p.valid += 1;
      if (keep) {
        p.policy += scale * k.surrogate;
        p.policy_tokens += 1;
      }
      if (keep && diagnostics) {
        if (k.clipped) {
          p.clipped += 1;
          if (c.advantage < 0) p.clip_low += 1;
          if (c.advantage > 0) p.clip_high += 1;
        }
        if (k.dual) p.dual += 1;
        p.ppo_kl += k.ppo_kl;
        p.ratio_sum += k.x;
        p.ratio_min = k.x < p.ratio_min ? k.x : p.ratio_min;
        p.ratio_max = k.x > p.ratio_max ? k.x : p.ratio_max;
        p.entropy_kept_sum += c.entropy;
      }
      if constexpr (Obj::kl_type::active) {
        if (kl_on) {
          p.kl += term_of(obj.kl).params.beta * v.coef * k.kl;
          p.kl_sum += k.kl;
        }
      }
      if constexpr (Obj::entropy_type::active) {
        if (term_on(obj.entropy)) p.entropy += k.entropy_grad * c.entropy;
      }
      if (grad_entropy) grad_entropy[t] = static_cast<T>(k.entropy_grad);
      if (diagnostics) {
        p.entropy_sum += c.entropy;
        const int third = (t >= v.cut1 ? 1 : 0) + (t >= v.cut2 ? 1 : 0);
        p.var_sum[third] += c.logp_variance;
        p.var_count[third] += 1;
      }
      grad_logp[t] = static_cast<T>(k.grad);
    }
    p.status |= fault_status(faults);
  }

  // The status bits of the deferred checks over the tokens [t0, t1), one token at a time (a
  // packed pass that found a fault somewhere in them names the inputs here).
  RECO_HOST_DEVICE std::uint32_t check_range(index_t t0, index_t t1) const {
    token_faults<double> faults;
    for (index_t t = t0; t < t1; ++t) {
      if (!b.valid(t)) continue;
      const double lp = static_cast<double>(b.logp[t]);
      token_value_checks(faults, checks, true, lp, b.old_logp ? static_cast<double>(b.old_logp[t]) : lp,
                         checks.ref_logp ? static_cast<double>(b.ref_logp[t]) : 0.0,
                         checks.entropy ? static_cast<double>(b.entropy[t]) : 0.0,
                         checks.token_weights ? static_cast<double>(b.token_weights[t]) : 0.0);
    }
    return fault_status(faults);
  }

  RECO_HOST_DEVICE token_partial operator()(index_t i, index_t t) const {
    token_partial p;
    accumulate_range(p, i, t, t + 1);
    return p;
  }
};


// Whether a call on backend be asks for the token diagnostics: a backend's `diagnostics` flag
// (reco::cpu), on where it has none.
template <class B, class = void>
struct has_diagnostics_flag : std::false_type {};
template <class B>
struct has_diagnostics_flag<B, std::void_t<decltype(std::declval<const B&>().diagnostics)>> : std::true_type {};
template <class B>
bool wants_diagnostics(const B& be) {
  if constexpr (has_diagnostics_flag<B>::value) return be.diagnostics;
  else return true;
}

// Single-thread step: the result from the partial sums.
struct result_fn {
  const objective_scalars* s;
  const token_partial* tp;
  objective_result* out;
  bool has_entropy;
  bool reads_rewards;
  index_t group_count;
  RECO_HOST_DEVICE static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }
  RECO_HOST_DEVICE void operator()(index_t) const {
    const token_partial& t = *tp;
    objective_result res;
    res.policy_loss = t.policy;
    res.kl_loss = t.kl;
    res.entropy_loss = t.entropy;
    res.loss = t.policy + t.kl + t.entropy;
    diagnostics& d = res.stats;
    d.clip_frac = ratio(t.clipped, t.policy_tokens);
    d.clip_frac_low = ratio(t.clip_low, t.policy_tokens);
    d.clip_frac_high = ratio(t.clip_high, t.policy_tokens);
    d.dual_clip_frac = ratio(t.dual, t.policy_tokens);
    d.ppo_kl = ratio(t.ppo_kl, t.policy_tokens);
    d.ratio_mean = ratio(t.ratio_sum, t.policy_tokens);
    // (min > max: no ratio recorded, the call asked for no diagnostics.)
    const bool ratios = t.policy_tokens > 0 && t.ratio_min <= t.ratio_max;
    d.ratio_min = ratios ? t.ratio_min : 0.0;
    d.ratio_max = ratios ? t.ratio_max : 0.0;
    d.ref_kl_mean = ratio(t.kl_sum, t.valid);
    d.entropy_mean = has_entropy ? ratio(t.entropy_sum, t.valid) : 0.0;
    d.entropy_kept_mean = has_entropy ? ratio(t.entropy_kept_sum, t.policy_tokens) : 0.0;
    d.kept_frac = ratio(t.policy_tokens, t.valid);
    const response_partial& rp = s->responses;
    d.weight_mean = ratio(rp.weight_sum, rp.weight_count);
    d.weight_min = rp.weight_count > 0 ? rp.weight_min : 0.0;
    d.weight_max = rp.weight_count > 0 ? rp.weight_max : 0.0;
    d.weight_cap_hits = static_cast<index_t>(rp.cap_hits);
    const double groups = static_cast<double>(group_count);
    d.zero_std_group_frac = reads_rewards ? ratio(s->groups.zero_std, groups) : 0.0;
    d.advantage_mean = rp.adv.weight > 0 ? rp.adv.mean : 0.0;
    d.advantage_std = ::sqrt(rp.adv.variance_biased());
    for (int k = 0; k < 3; ++k) d.token_variance[k] = ratio(t.var_sum[k], t.var_count[k]);
    d.valid_tokens = static_cast<index_t>(t.valid);
    d.policy_tokens = static_cast<index_t>(t.policy_tokens);
    d.nonempty_responses = static_cast<index_t>(s->batch.nonempty);
    res.status = s->status | s->norm_status | t.status;
    *out = res;
  }
};

}  // namespace detail
RECO_NAMESPACE_END
