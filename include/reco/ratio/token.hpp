// The PPO/GRPO token ratio r = exp(logp - old_logp); the log-ratio is clamped to +-20 by default
// (verl, OpenRLHF; TRL has no clamp: set log_ratio_clamp = 0). Where the clamp bites the
// derivative is 0, as autograd gives through a clamp.
#pragma once

#include <cmath>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
// exp(clamp(l)) and whether the clamp let the derivative through; limit <= 0 disables it.
template <class V>
RECO_TOKEN_MATH V clamped_exp(const V& l, double limit, mask_t<V>& passes) {
  passes = true;
  // The bounds outside the branch: a pack's loop then computes them once, not per pack.
  const V lo(-limit), hi(limit);
  if (limit > 0) {
    const V lc = mind(maxd(l, lo), hi);
    passes = lc == l;
    // Within the default clamp (20) the exponential needs no range clamp of its own.
    if (limit <= 64) return vexp_within(lc);
    return vexp(lc);
  }
  return vexp(l);
}
}  // namespace detail

struct token_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double log_ratio_clamp = 20.0;  // |logp - old_logp| limit before exp; 0 disables
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("log_ratio_clamp", p.log_ratio_clamp);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp", "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = false;

  template <class V>
  RECO_TOKEN_MATH basic_ratio_value<V> eval(const basic_token_context<V>& c) const {
    detail::mask_t<V> passes;
    const V r = detail::clamped_exp(c.logp - c.old_logp, params.log_ratio_clamp, passes);
    return {r, detail::select(passes, r, V(0.0)), false, false};
  }
};

RECO_NAMESPACE_END
