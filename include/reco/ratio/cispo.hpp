// CISPO (MiniMax-M1): loss -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp. The truncated ratio only
// scales the gradient, which therefore never vanishes: d loss / d logp = -A clip(r).
// Defaults: no lower bound (eps_low = 1, MiniMax-M1 "did not impose a lower bound"), upper bound
// 1 + 5 (the large IS cap of SkyRL's CISPO example). Tokens whose weight was truncated count as
// clipped in the diagnostics. Carries its own clipping: compose with no_clip.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

struct cispo_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double eps_low = 1.0;
    double eps_high = 5.0;
    double log_ratio_clamp = 20.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps_low", p.eps_low);
    v("eps_high", p.eps_high);
    v("log_ratio_clamp", p.log_ratio_clamp);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.eps_low >= 0 && params.eps_low <= 1, name, "eps_low", "must be in [0, 1]");
    check_param(finite_param(params.eps_high) && params.eps_high >= 0, name, "eps_high", "must be finite and >= 0");
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp", "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = true;

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate(const basic_token_context<V>& c) const {
    detail::mask_t<V> passes;
    basic_surrogate_value<V> s;
    s.x = detail::clamped_exp(c.logp - c.old_logp, params.log_ratio_clamp, passes);
    const double lo = 1.0 - params.eps_low, hi = 1.0 + params.eps_high;
    const V w = detail::clampd(s.x, lo, hi);
    s.clipped = (s.x < lo || s.x > hi) && c.advantage != 0;
    s.loss = -w * c.advantage * c.logp;
    s.grad = -w * c.advantage;
    return s;
  }
};

RECO_NAMESPACE_END
