// PPO clipping with separate eps_low / eps_high (clip-higher), plus an optional dual clip:
//   loss = max(-A S(x), -A S(clip(x, 1 - eps_low, 1 + eps_high)))   (S(x) = x, or 1/x for ASPO)
// The gradient flows only through the unclipped branch: d loss / d logp = -A omega.
//   hard dual clip (verl, c = 3; DAPO recipe c = 10): for A < 0 the loss is capped at -A c, with
//     gradient 0 where the cap bites;
//   soft dual clip (ASPO, c = 3): where an unclipped token's ratio exceeds c (A < 0 with x > c;
//     A > 0 with ASPO's reciprocal 1/x > c; x the clamped ratio) the loss becomes -A sg(c) logp,
//     so the gradient keeps flowing with weight c.
// delta (TRL's two-sided GRPO clip, INTELLECT-2; 0 = off) caps the unclipped branch's ratio for
// every advantage sign: loss = max(-A S(min(x, delta)), -A S(clip(x, 1 - eps_low, 1 + eps_high))).
//   A > 0: the ratio is min(x, 1 + eps_high, delta); it binds only when delta < 1 + eps_high.
//   A < 0: the ratio is min(max(x, 1 - eps_low), max(delta, 1 + eps_high)): past
//     max(delta, 1 + eps_high) the loss is the constant -A max(delta, 1 + eps_high), gradient 0
//     (for delta >= 1 + eps_high this is the hard dual clip at c = delta).
//   Tokens the delta cap decides count in the dual-clip diagnostics.
#pragma once

#include <cstdint>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

enum class dual_clip_mode : std::uint8_t { off, hard, soft };
constexpr choice_labels<3> labels_of(dual_clip_mode) { return {{"off", "hard", "soft"}}; }

namespace detail {

// The advantage is per response, so every test on its sign is a plain branch; tests on the ratio
// are per token (select).
template <class V>
RECO_TOKEN_MATH basic_surrogate_value<V> ppo_surrogate(const basic_ratio_value<V>& rv, const basic_token_context<V>& c,
                                                       const V& eps_low, const V& eps_high, dual_clip_mode dual,
                                                       double dual_c, double delta = 0.0) {
  using mask = mask_t<V>;
  basic_surrogate_value<V> s;
  s.x = rv.x;
  const double a = c.advantage;
  // Per-response values outside the branches: a pack's loop then computes them once.
  const V upper = V(1.0) + eps_high, lower = V(1.0) - eps_low, minus_a(-a);
  mask clipped = rv.clipped;
  V rho = rv.x;
  if (a > 0) {
    clipped = clipped || rv.x > upper;
    rho = mind(rv.x, upper);
  } else if (a < 0) {
    clipped = clipped || rv.x < lower;
    rho = maxd(rv.x, lower);
  }
  mask capped = false;  // the delta cap decided the value (and zeroed the gradient)
  if (delta > 0 && a != 0) {
    if (a > 0) {
      capped = !clipped && rv.x > delta;
      rho = mind(rho, V(delta));
    } else {
      const V cap = maxd(V(delta), V(1.0) + eps_high);
      capped = rv.x > cap;
      rho = mind(rho, cap);
    }
  }
  s.loss = minus_a * (rv.reciprocal ? V(1.0) / rho : rho);
  s.grad = select(clipped || capped, V(0.0), minus_a * rv.omega);
  s.clipped = clipped && a != 0;
  s.dual = capped;
  const V dual_cap(-a * dual_c);
  if (dual == dual_clip_mode::hard) {
    if (a < 0) {
      const mask hard = s.loss > dual_cap;
      s.loss = mind(s.loss, dual_cap);
      s.grad = select(hard, V(0.0), s.grad);
      s.dual = s.dual || hard;
    }
  } else if (dual == dual_clip_mode::soft) {
    if (a != 0) {
      // The test is on the ratio itself (1/rho for the reciprocal surrogate), as the definition
      // states: omega equals it where the log-ratio clamp lets the derivative through, but is 0
      // where the clamp bites, and the dual clip must still fire there.
      const V beyond = rv.reciprocal ? V(1.0) / rv.x : rv.x;
      const mask soft = !clipped && !capped && beyond > dual_c;
      s.loss = select(soft, -a * dual_c * c.logp, s.loss);
      s.grad = select(soft, V(-a * dual_c), s.grad);
      s.dual = s.dual || soft;
    }
  }
  return s;
}

}  // namespace detail

struct ppo_clip {
  using role = roles::clip_policy;
  struct params_type {
    double eps_low = 0.2;
    double eps_high = 0.2;
    dual_clip_mode dual_clip = dual_clip_mode::off;
    double dual_clip_c = 3.0;  // must exceed 1
    double delta = 0.0;        // TRL's upper cap of the unclipped ratio; 0 = off
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps_low", p.eps_low);
    v("eps_high", p.eps_high);
    v("dual_clip", p.dual_clip);
    v("dual_clip_c", p.dual_clip_c);
    v("delta", p.delta);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.eps_low >= 0 && params.eps_low <= 1, name, "eps_low", "must be in [0, 1]");
    check_param(finite_param(params.eps_high) && params.eps_high >= 0, name, "eps_high", "must be finite and >= 0");
    check_param(params.dual_clip == dual_clip_mode::off || (finite_param(params.dual_clip_c) && params.dual_clip_c > 1), name, "dual_clip_c", "must be finite and > 1 when the dual clip is on");
    check_param(finite_param(params.delta) && params.delta >= 0, name, "delta", "must be finite and >= 0 (0 = off)");
  }

  static constexpr bool needs_entropy = false;
  static constexpr bool needs_entropy_quantile = false;
  static constexpr bool clips = true;

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> apply(const basic_ratio_value<V>& rv,
                                                  const basic_token_context<V>& c) const {
    return detail::ppo_surrogate(rv, c, V(params.eps_low), V(params.eps_high), params.dual_clip,
                                 params.dual_clip_c, params.delta);
  }
};

RECO_NAMESPACE_END
