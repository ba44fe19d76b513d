// No ratio (REINFORCE / GPG): loss -A logp, gradient -A. Carries no clipping: compose with no_clip.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

struct reinforce_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double log_ratio_clamp = 20.0;  // only for the ratio shown in the diagnostics
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
  static constexpr bool self_clipped = true;

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate(const basic_token_context<V>& c) const {
    detail::mask_t<V> passes;
    basic_surrogate_value<V> s;
    s.x = detail::clamped_exp(c.logp - c.old_logp, params.log_ratio_clamp, passes);
    s.loss = -c.advantage * c.logp;
    s.grad = V(-c.advantage);
    return s;
  }
};

RECO_NAMESPACE_END
