// ASPO's flipped ratio. For A > 0 the surrogate is -A rho / sg(rho)^2 with rho = min(r, 1 + eps_high):
// its value is -A / rho and its gradient weight 1/r = pi_old / pi (0 where clipped). For A < 0
// the standard token ratio is used, unless flip_all (an ablation) flips every token.
// The clip decision is the usual one on r; only the surrogate built on rho changes.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

struct flipped_ratio {
  using role = roles::ratio_form;
  struct params_type {
    bool flip_all = false;          // flip tokens with A < 0 too
    double log_ratio_clamp = 20.0;  // as token_ratio
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("flip_all", p.flip_all);
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
    const bool flip = params.flip_all || c.advantage > 0;
    if (!flip) return {r, detail::select(passes, r, V(0.0)), false, false};
    return {r, detail::select(passes, V(1.0) / r, V(0.0)), true, false};
  }
};

RECO_NAMESPACE_END
