// SAPO's soft gate: loss -sigmoid(tau (r - 1)) (4 / tau) A, tau = tau_pos if A > 0 else tau_neg.
// d loss / d logp = -4 A sigmoid (1 - sigmoid) r. Never clipped: compose with no_clip.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

struct sapo_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double tau_pos = 1.0;
    double tau_neg = 1.05;
    double log_ratio_clamp = 20.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("tau_pos", p.tau_pos);
    v("tau_neg", p.tau_neg);
    v("log_ratio_clamp", p.log_ratio_clamp);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.tau_pos) && params.tau_pos > 0, name, "tau_pos", "must be finite and > 0");
    check_param(finite_param(params.tau_neg) && params.tau_neg > 0, name, "tau_neg", "must be finite and > 0");
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp", "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = true;

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate(const basic_token_context<V>& c) const {
    detail::mask_t<V> passes;
    basic_surrogate_value<V> s;
    const V r = detail::clamped_exp(c.logp - c.old_logp, params.log_ratio_clamp, passes);
    const double tau = c.advantage > 0 ? params.tau_pos : params.tau_neg;
    const V g = detail::sigmoid(tau * (r - 1.0));
    s.x = r;
    s.loss = -g * (4.0 / tau) * c.advantage;
    s.grad = detail::select(passes, -4.0 * c.advantage * g * (1.0 - g) * r, V(0.0));
    return s;
  }
};

RECO_NAMESPACE_END
