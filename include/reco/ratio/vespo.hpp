// VESPO (TRL loss_type "vespo"): loss -sg(phi_i) A logp with a per-response gamma weight
//   log w_i = clamp( sum_t clamp(logp_t - old_logp_t, -20, 20), log 1e-8, 20 ),  w_i = exp(log w_i),
//   phi_i   = exp( lambda + k log w_i - lambda w_i )  = e^lambda w^k e^(-lambda w)   (phi(1) = 1),
// (k, lambda) = (k_pos, lambda_pos) for A >= 0 and (k_neg, lambda_neg) for A < 0. The weight only
// scales the gradient: d loss / d logp = -A phi_i. w is the product of the token ratios (a sum
// of log-ratios, not GSPO's mean). Defaults are TRL's (k 2 / lambda 3 for A >= 0, k 3 / lambda 2
// for A < 0). The diagnostics show w_i; no token counts as clipped. Carries its own clipping
// (none): compose with no_clip.
#pragma once

#include <cmath>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

struct vespo_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double k_pos = 2.0;
    double lambda_pos = 3.0;
    double k_neg = 3.0;
    double lambda_neg = 2.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("k_pos", p.k_pos);
    v("lambda_pos", p.lambda_pos);
    v("k_neg", p.k_neg);
    v("lambda_neg", p.lambda_neg);
  }

  // Throws reco::error naming the first parameter out of range (the weight is a gamma-shaped
  // density in w: shape and rate are >= 0).
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    auto ok = [](double x) { return finite_param(x) && x >= 0; };
    check_param(ok(params.k_pos), name, "k_pos", "must be finite and >= 0");
    check_param(ok(params.lambda_pos), name, "lambda_pos", "must be finite and >= 0");
    check_param(ok(params.k_neg), name, "k_neg", "must be finite and >= 0");
    check_param(ok(params.lambda_neg), name, "lambda_neg", "must be finite and >= 0");
  }

  static constexpr ratio_scope scope = ratio_scope::sequence;
  static constexpr bool self_clipped = true;
  static constexpr bool sequence_sum = true;  // sequence_log_ratio = the sum below, not the mean

  RECO_HOST_DEVICE double sequence_term(const token_context& c) const {
    return detail::clampd(c.logp - c.old_logp, -20.0, 20.0);
  }

  // phi of a response: one scalar per response, computed from its sequence value.
  RECO_HOST_DEVICE double log_weight(double sequence_log_ratio) const {
    return detail::clampd(sequence_log_ratio, -18.420680743952367, 20.0);  // [log 1e-8, 20]
  }

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate(const basic_token_context<V>& c) const {
    const bool pos = c.advantage >= 0;
    const double k = pos ? params.k_pos : params.k_neg;
    const double lambda = pos ? params.lambda_pos : params.lambda_neg;
    const double lw = log_weight(c.sequence_log_ratio);
    const double w = ::exp(lw);
    const double phi = ::exp(lambda + k * lw - lambda * w);
    basic_surrogate_value<V> s;
    s.x = V(w);
    s.clipped = false;
    s.loss = -phi * c.advantage * c.logp;
    s.grad = V(-phi * c.advantage);
    return s;
  }
};

RECO_NAMESPACE_END
