// The per-token body of the objective, written once over the value type V: double for one token
// (the CPU's scalar token loop and the fused CUDA token step) or a pack of tokens of one response
// (the CPU backend's packed loop, reco/backend/cpu/packed_tokens.hpp: doubles for double inputs,
// floats for float inputs; the precision policy is in docs/conventions.md). The loops load a token's inputs into a basic_token_context,
// call token_body and add up what it returns; the value checks of the per-token inputs are here
// too (token_value_checks), shared by the CPU response scan and the CUDA token step. So every CPU
// test also runs the arithmetic the GPU runs.
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "reco/component.hpp"
#include "reco/config.hpp"
#include "reco/detail/math.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// The policy-gradient surrogate of one token: a self-clipped ratio form computes it alone,
// any other goes through the clip policy.
template <class Obj, class V>
RECO_TOKEN_MATH basic_surrogate_value<V> policy_surrogate(const Obj& obj, const basic_token_context<V>& c) {
  basic_surrogate_value<V> s;
  if constexpr (is_selectable_v<typename Obj::ratio_type>) {
    s = obj.ratio.surrogate_with(obj.clip, c);
  } else if constexpr (Obj::ratio_type::self_clipped) {
    s = obj.ratio.surrogate(c);
  } else {
    s = obj.clip.apply(obj.ratio.eval(c), c);
  }
  // A = 0 contributes exactly 0 loss and 0 gradient, also where an unclamped ratio overflows
  // (0 * inf would be NaN).
  if (c.advantage == 0) {
    s.loss = V(0.0);
    s.grad = V(0.0);
  }
  return s;
}

// A KL term's estimator: eval for one token (the kl_term interface), estimate for a pack.
template <class K, class V>
RECO_TOKEN_MATH basic_kl_value<V> kl_estimate(const K& kl, const V& logp, const V& ref_logp) {
  if constexpr (std::is_same_v<V, double>) {
    return kl.eval(logp, ref_logp);
  } else {
    return kl.estimate(logp, ref_logp);
  }
}

// The KL term at one token: a term may reweight its estimate by the token's log-ratio to the
// sampling policy (kl_penalty's importance_weighted).
template <class K, class V, class = void>
struct kl_reweights : std::false_type {};
template <class K, class V>
struct kl_reweights<K, V, std::void_t<decltype(std::declval<const K&>().reweight(std::declval<const basic_kl_value<V>&>(),
                                                                                std::declval<const V&>()))>>
    : std::true_type {};

template <class K, class V>
RECO_TOKEN_MATH basic_kl_value<V> kl_at(const K& kl, const basic_token_context<V>& c, const V& ref_logp) {
  const basic_kl_value<V> k = kl_estimate(kl, c.logp, ref_logp);
  if constexpr (kl_reweights<K, V>::value) {
    return kl.reweight(k, c.logp - c.old_logp);
  } else {
    return k;
  }
}

// What one token (or each lane of a pack) adds. Lanes outside `valid` hold 0 everywhere below,
// and lanes outside `policy` hold 0 in the policy-only fields, so a loop adds them as they are.
template <class V>
struct token_terms {
  V surrogate = V(0.0);     // the surrogate loss unscaled (policy tokens); the sums scale it
  V grad = V(0.0);          // d loss / d logp: policy part + KL part; exactly +0 on invalid lanes
  V kl = V(0.0);            // the KL estimator's value, unscaled (valid tokens, KL term on)
  V entropy_grad = V(0.0);  // d loss / d entropy (valid tokens, entropy term on)
  V ppo_kl = V(0.0);        // old_logp - logp (policy tokens)
  V x = V(1.0);             // the ratio the clip sees (diagnostics; not masked)
  mask_t<V> clipped = false;  // policy tokens in a clipped branch
  mask_t<V> dual = false;     // policy tokens where the dual clip fired
};

// One token's (or pack's) contribution. `valid`: tokens in the mask (lanes outside it may hold
// any stand-in values that keep the math finite); `policy`: the valid tokens the selector kept;
// `scale`: the policy term's aggregation coefficient times the response and token weights;
// `coef`: the aggregation coefficient of the KL and entropy terms.
template <class Obj, class V>
RECO_TOKEN_MATH token_terms<V> token_body(const Obj& obj, const basic_token_context<V>& c, const mask_t<V>& valid,
                                          const mask_t<V>& policy, const V& ref_logp, const V& scale, double coef) {
  token_terms<V> r;
  // 0 + g: an exact zero gradient is +0, whichever terms are on.
  V grad = V(0.0);
  // One token skips the surrogate when it is not a policy token; a pack computes every lane
  // and selects.
  bool surrogate = true;
  if constexpr (std::is_same_v<mask_t<V>, bool>) surrogate = policy;
  if (surrogate) {
    const basic_surrogate_value<V> sv = policy_surrogate(obj, c);
    r.surrogate = select(policy, sv.loss, V(0.0));
    grad = add_selected(policy, grad, scale * sv.grad);
    r.ppo_kl = select(policy, c.old_logp - c.logp, V(0.0));
    r.x = sv.x;
    r.clipped = policy && sv.clipped;
    r.dual = policy && sv.dual;
  }
  if constexpr (Obj::kl_type::active) {
    if (term_on(obj.kl)) {
      const auto& kl = term_of(obj.kl);
      const basic_kl_value<V> k = kl_at(kl, c, ref_logp);
      r.kl = select(valid, k.value, V(0.0));
      grad = add_selected(valid, grad, kl.params.beta * coef * k.grad);
    }
  }
  r.grad = grad;
  if constexpr (Obj::entropy_type::active) {
    if (term_on(obj.entropy)) r.entropy_grad = select(valid, V(-term_of(obj.entropy).params.coef * coef), V(0.0));
  }
  return r;
}

// The token-variance diagnostic p (1 - p), p = exp(logp), of the valid tokens (lanes): apart
// from the body, so that a call without diagnostics does not compute it.
template <class V>
RECO_TOKEN_MATH V token_variance(const V& logp, const mask_t<V>& valid) {
  return select(valid, bernoulli_variance(logp, 0.0), V(0.0));
}
// The token variance into the context before the body runs, so that a ratio form needing p (1 - p)
// of logp (ReCo's) reads it instead of computing it again (lanes outside `valid` hold 0).
template <class V>
RECO_TOKEN_MATH void set_logp_variance(basic_token_context<V>& c, const mask_t<V>& valid) {
  c.logp_variance = token_variance(c.logp, valid);
  c.has_logp_variance = true;
}
// The same on every lane of a pack: its invalid lanes hold their stand-ins' variance, which its
// sums leave out (one blend per pack fewer).
template <class V>
RECO_TOKEN_MATH void set_logp_variance(basic_token_context<V>& c) {
  c.logp_variance = bernoulli_variance(c.logp, 0.0);
  c.has_logp_variance = true;
}

// ---- value checks of the per-token inputs --------------------------------------------------

// Which per-token inputs a pass checks.
struct token_checks {
  bool old_logp = false;
  bool ref_logp = false;
  bool entropy = false;
  bool token_weights = false;
  bool logp = true;
  RECO_HOST_DEVICE bool any() const { return logp || old_logp || ref_logp || entropy || token_weights; }
};

// Per input, the tokens (lanes) that failed a check so far.
template <class V>
struct token_faults {
  mask_t<V> logp = false, old_logp = false, ref_logp = false, entropy = false, token_weights = false;
};

// Log-probabilities must be finite and <= 0 (a positive one is usually a negative
// log-likelihood passed by mistake); entropies finite; token weights finite and >= 0. Each test
// is false for NaN.
// (The largest finite value of the lanes' type: float lanes hold float inputs.)
template <class V>
RECO_TOKEN_MATH double largest_finite() {
  return single_precision_v<V> ? double(FLT_MAX) : DBL_MAX;
}
template <class V>
RECO_TOKEN_MATH mask_t<V> bad_log_probability(const V& x) {
  return !(x <= V(0.0) && x >= V(-largest_finite<V>()));
}
template <class V>
RECO_TOKEN_MATH mask_t<V> bad_finite(const V& x) {
  return !(x - x == V(0.0));
}
template <class V>
RECO_TOKEN_MATH mask_t<V> bad_weight(const V& x) {
  return !(x >= V(0.0) && x <= V(largest_finite<V>()));
}

// The valid lanes whose log-probability fails its check: a lane type may have its own form
// (lanes<V>::bad_log_probability: AVX-512's mask registers test the bits in two instructions).
template <class V, class = void>
struct has_lane_log_probability_check : std::false_type {};
template <class V>
struct has_lane_log_probability_check<V, std::void_t<decltype(lanes<V>::bad_log_probability(
                                             std::declval<const mask_t<V>&>(), std::declval<const V&>()))>>
    : std::true_type {};
template <class V>
RECO_TOKEN_MATH mask_t<V> bad_valid_log_probability(const mask_t<V>& valid, const V& x) {
  if constexpr (has_lane_log_probability_check<V>::value) return lanes<V>::bad_log_probability(valid, x);
  else return valid && bad_log_probability(x);
}

// Ors the checks of the valid tokens (lanes) into `f`. Values of inputs `which` leaves out are
// not read.
template <class V>
RECO_TOKEN_MATH void token_value_checks(token_faults<V>& f, const token_checks& which, const mask_t<V>& valid,
                                        const V& logp, const V& old_logp, const V& ref_logp, const V& entropy,
                                        const V& token_weight) {
  if (which.logp) f.logp = f.logp || bad_valid_log_probability(valid, logp);
  if (which.old_logp) f.old_logp = f.old_logp || bad_valid_log_probability(valid, old_logp);
  if (which.ref_logp) f.ref_logp = f.ref_logp || bad_valid_log_probability(valid, ref_logp);
  if (which.entropy) f.entropy = f.entropy || (valid && bad_finite(entropy));
  if (which.token_weights) f.token_weights = f.token_weights || (valid && bad_weight(token_weight));
}

// The valid lanes where any input `which` names fails its check: one mask for every input (a
// pass that needs the bits per input finds them again on its rare failing stretch).
template <class V>
RECO_TOKEN_MATH mask_t<V> token_value_faults(const token_checks& which, const mask_t<V>& valid, const V& logp,
                                             const V& old_logp, const V& ref_logp, const V& entropy,
                                             const V& token_weight) {
  mask_t<V> f = false;
  if (which.logp) f = bad_valid_log_probability(valid, logp);
  if (which.old_logp) f = f || bad_valid_log_probability(valid, old_logp);
  if (which.ref_logp) f = f || bad_valid_log_probability(valid, ref_logp);
  if (which.entropy) f = f || (valid && bad_finite(entropy));
  if (which.token_weights) f = f || (valid && bad_weight(token_weight));
  return f;
}

// The status bits of the faults found.
template <class V>
RECO_TOKEN_MATH std::uint32_t fault_status(const token_faults<V>& f) {
  std::uint32_t s = 0;
  if (lanes<V>::any(f.logp)) s |= bad_logp;
  if (lanes<V>::any(f.old_logp)) s |= bad_old_logp;
  if (lanes<V>::any(f.ref_logp)) s |= bad_ref_logp;
  if (lanes<V>::any(f.entropy)) s |= bad_entropy;
  if (lanes<V>::any(f.token_weights)) s |= bad_token_weights;
  return s;
}

}  // namespace detail
RECO_NAMESPACE_END
