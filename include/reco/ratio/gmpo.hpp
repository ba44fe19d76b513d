// GMPO's geometric-mean sequence ratio with a sign-aware clip in log space:
//   m_t = sgn(A) min(sgn(A) l_t, sgn(A) clamp(l_t, -eps_low, eps_high)),  l_t = logp - old_logp,
//   x_i = exp(mean_t m_t).
// Written per token like GSPO: every token carries the value x_i, and d x / d logp_t = x_i where
// token t is unclipped (A > 0: l_t <= eps_high; A < 0: l_t >= -eps_low), 0 where it is clipped.
// With seq_mean_token_mean this is exactly the gradient of -A x_i / R'. Compose with no_clip.
#pragma once

#include <cmath>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

struct gmpo_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double eps_low = 0.4;   // log-space bounds: the token ratio stays in [e^-0.4, e^0.4]
    double eps_high = 0.4;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps_low", p.eps_low);
    v("eps_high", p.eps_high);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.eps_low) && params.eps_low >= 0, name, "eps_low", "must be finite and >= 0");
    check_param(finite_param(params.eps_high) && params.eps_high >= 0, name, "eps_high", "must be finite and >= 0");
  }

  static constexpr ratio_scope scope = ratio_scope::sequence;
  static constexpr bool self_clipped = false;

  template <class V>
  RECO_TOKEN_MATH detail::mask_t<V> unclipped(const basic_token_context<V>& c) const {
    const V l = c.logp - c.old_logp;
    if (c.advantage > 0) return l <= params.eps_high;
    if (c.advantage < 0) return l >= -params.eps_low;
    return true;
  }
  RECO_HOST_DEVICE double sequence_term(const token_context& c) const {
    const double a = detail::sign(c.advantage);
    const double l = c.logp - c.old_logp;
    const double lc = detail::clampd(l, -params.eps_low, params.eps_high);
    return a * detail::mind(a * l, a * lc);
  }
  // x is per response (one scalar exp); the clip decision is per token.
  template <class V>
  RECO_TOKEN_MATH basic_ratio_value<V> eval(const basic_token_context<V>& c) const {
    const double x = ::exp(c.sequence_log_ratio);
    const detail::mask_t<V> u = unclipped(c);
    return {V(x), detail::select(u, V(x), V(0.0)), false, !u};
  }
};

RECO_NAMESPACE_END
