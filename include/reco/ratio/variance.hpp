// ReCo's token variance ratio  v = p (1 - sg p) / (p_old (1 - p_old)),  p = exp(logp).
// Its gradient weight is v itself: d/dlogp of p (1 - sg p) is p (1 - p).
//
// Numerics. 1 - p comes from -expm1(logp) when p > 1/2, so it is exact as p -> 1, and each Bernoulli
// variance is floored at variance_floor so that a saturated token (p = 1 or p = 0 exactly, common
// with bf16 log-probs) gives a finite ratio instead of 0/0:
//   v = max(p(1-p), floor) / max(p_old(1-p_old), floor),  d v / d logp = v.
// With the floor equal on both sides, v = 1 exactly whenever logp == old_logp, so the on-policy
// identity (variance ratio == token ratio == 1) holds even at saturation. The floor also bounds v
// (no overflow), so the ratio is formed in linear space; its log is clamped like the token
// ratio's (+-20 by default; derivative 0 beyond), by comparing v with e^{+-20}.
#pragma once

#include <cmath>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

struct variance_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double variance_floor = 1e-12;  // lower bound on p(1-p) and p_old(1-p_old)
    double log_ratio_clamp = 20.0;  // |log v| limit; 0 disables
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("variance_floor", p.variance_floor);
    v("log_ratio_clamp", p.log_ratio_clamp);
  }

  // e^{+-log_ratio_clamp}, derived from params on the host before a call (see prepare()).
  struct derived_type {
    double upper = 0;  // 0: not prepared, computed on the fly
    double lower = 0;
  };
  derived_type derived{};
  void prepare() {
    derived.upper = ::exp(params.log_ratio_clamp);
    derived.lower = ::exp(-params.log_ratio_clamp);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.variance_floor > 0 && params.variance_floor <= 0.25, name, "variance_floor", "must be in (0, 0.25]");
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp", "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = false;

  template <class V>
  RECO_TOKEN_MATH basic_ratio_value<V> eval(const basic_token_context<V>& c) const {
    // The diagnostic's p (1 - p) is floored at most at the lanes' smallest normal, below every
    // variance_floor's effect: flooring it again gives the same bits as computing it here.
    const V p_variance = c.has_logp_variance ? detail::maxd(c.logp_variance, V(params.variance_floor))
                                             : detail::bernoulli_variance(c.logp, params.variance_floor);
    V v = p_variance / detail::bernoulli_variance(c.old_logp, params.variance_floor);
    detail::mask_t<V> passes = true;
    if (params.log_ratio_clamp > 0) {
      const double hi = derived.upper > 0 ? derived.upper : ::exp(params.log_ratio_clamp);
      const double lo = derived.upper > 0 ? derived.lower : ::exp(-params.log_ratio_clamp);
      const V vc = detail::clampd(v, lo, hi);
      passes = vc == v;
      v = vc;
    }
    return {v, detail::select(passes, v, V(0.0)), false, false};
  }
};

RECO_NAMESPACE_END
