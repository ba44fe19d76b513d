// seq_mean_token_sum_norm (Dr.GRPO): L = sum_t m_t l_t / C with a constant C; c_it = 1 / C.
// Default C = R * L_max (TRL): R the responses passed in, L_max = max_length, or when that is 0
// the padded T (the longest response span for a packed batch). verl's form is C = T alone:
// set `constant`. Under data parallelism pass the global constant.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct seq_mean_token_sum_norm {
  using role = roles::loss_aggregator;
  struct params_type {
    double constant = 0.0;    // C; 0 = R * L_max
    double max_length = 0.0;  // L_max; 0 = from the layout
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("constant", p.constant);
    v("max_length", p.max_length);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.constant) && params.constant >= 0, name, "constant", "must be finite and >= 0 (0 = R * L_max)");
    check_param(finite_param(params.max_length) && params.max_length >= 0, name, "max_length", "must be finite and >= 0 (0 = from the layout)");
  }

  RECO_HOST_DEVICE double constant_for(const aggregation_counts& n) const {
    if (params.constant > 0) return params.constant;
    const double lmax = params.max_length > 0 ? params.max_length : n.max_length;
    return n.all_responses * lmax;
  }
  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t) const {
    const double c = constant_for(n);
    return c > 0 ? 1.0 / c : 0.0;
  }
};

RECO_NAMESPACE_END
