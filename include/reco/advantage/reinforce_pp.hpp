// REINFORCE++ with a group baseline: a_i = s_i - mean_g, then whitened over all valid tokens of
// the batch: A_i = (a_i - mu) / sqrt(var + eps), mu and var token-weighted (each response counts
// |o_i| times), var unbiased by default (verl; OpenRLHF uses the biased one).
#pragma once

#include <cmath>

#include <string>

#include "reco/advantage/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct reinforce_pp_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    double eps = 1e-8;            // inside the square root
    bool unbiased_variance = true;
    singleton_policy singleton = singleton_policy::zero;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps", p.eps);
    v("unbiased_variance", p.unbiased_variance);
    v("singleton", p.singleton);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.eps) && params.eps >= 0, name, "eps", "must be finite and >= 0");
  }

  static constexpr advantage_input input = advantage_input::rewards;
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::token_whiten;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    if (detail::handle_singleton(g, params.singleton, 1.0, out, status)) return;
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    for (index_t j = 0; j < g.size; ++j) out[j] = static_cast<double>(g.rewards[j]) - mean;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats& s) const {
    const double var = params.unbiased_variance ? s.token_var_unbiased : s.token_var_biased;
    const double x = a - s.token_mean;
    return x == 0 ? 0.0 : x / ::sqrt(var + params.eps);  // 0 / 0 (all equal, eps = 0) is 0
  }
};

RECO_NAMESPACE_END
