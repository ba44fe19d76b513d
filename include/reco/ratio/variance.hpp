// ReCo's token variance ratio  v = p (1 - sg p) / (p_old (1 - p_old)),  p = exp(logp).
// Its gradient weight is v itself: d/dlogp of p (1 - sg p) is p (1 - p).
//
// Numerics. Both Bernoulli variances are formed in log space, log(q(1-q)) = log q + log(-expm1(log q)),
// which is exact as q -> 1, and each is floored at variance_floor so that a saturated token
// (q = 1 or q = 0 exactly, common with bf16 log-probs) gives a finite ratio instead of 0/0:
//   v = max(p(1-p), floor) / max(p_old(1-p_old), floor),  d v / d logp = v.
// With the floor equal on both sides, v = 1 exactly whenever logp == old_logp, so the on-policy
// identity (variance ratio == token ratio == 1) holds even at saturation. The log of v is clamped
// like the token ratio's (+-20 by default; derivative 0 beyond).
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

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.variance_floor > 0 && params.variance_floor <= 0.25, name, "variance_floor", "must be in (0, 0.25]");
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp", "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = false;
  static constexpr bool needs_probabilities = true;  // logp and old_logp must be <= 0

  RECO_HOST_DEVICE ratio_value eval(const token_context& c) const {
    const double log_floor = ::log(params.variance_floor);
    const double lv = detail::log_bernoulli_variance(c.logp, log_floor) -
                      detail::log_bernoulli_variance(c.old_logp, log_floor);
    bool passes;
    const double v = detail::clamped_exp(lv, params.log_ratio_clamp, passes);
    return {v, passes ? v : 0.0, false, false};
  }
};

RECO_NAMESPACE_END
