// GSPO's sequence ratio, written per token so that gradients stay per token:
//   s_it = exp( sg(mean_t(logp - old_logp)) + logp_it - sg(logp_it) ),
// value s_i = exp(mean log-ratio of response i), d s_it / d logp_it = s_i. The log value is capped
// at 10 (verl; TRL and OpenRLHF take exp of the mean uncapped); above the cap the gradient is 0.
#pragma once

#include <cmath>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct sequence_ratio {
  using role = roles::ratio_form;
  struct params_type {
    double max_log_ratio = 10.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("max_log_ratio", p.max_log_ratio);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.max_log_ratio), name, "max_log_ratio", "must be finite");
  }

  static constexpr ratio_scope scope = ratio_scope::sequence;
  static constexpr bool self_clipped = false;

  // Summed over a response's valid tokens and divided by |o_i| to form sequence_log_ratio.
  RECO_HOST_DEVICE double sequence_term(const token_context& c) const { return c.logp - c.old_logp; }

  // Per response: every token of a response carries the same value.
  template <class V>
  RECO_TOKEN_MATH basic_ratio_value<V> eval(const basic_token_context<V>& c) const {
    const bool passes = c.sequence_log_ratio <= params.max_log_ratio;
    const double s = ::exp(passes ? c.sequence_log_ratio : params.max_log_ratio);
    return {V(s), V(passes ? s : 0.0), false, false};
  }
};

RECO_NAMESPACE_END
