// GRPO's group-relative advantage: A_i = (s_i - mean_g) / (std_g + eps), std unbiased.
#pragma once

#include <string>

#include "reco/advantage/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct grpo_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    double eps = 1e-6;          // added to the std (verl's default; TRL 1e-4, OpenRLHF 1e-9)
    bool scale_by_std = true;   // false gives Dr.GRPO's A_i = s_i - mean_g
    singleton_policy singleton = singleton_policy::zero;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps", p.eps);
    v("scale_by_std", p.scale_by_std);
    v("singleton", p.singleton);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.eps) && params.eps >= 0, name, "eps", "must be finite and >= 0");
  }

  static constexpr advantage_input input = advantage_input::rewards;
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::none;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    const double raw_scale = params.scale_by_std ? 1.0 / (1.0 + params.eps) : 1.0;
    if (detail::handle_singleton(g, params.singleton, raw_scale, out, status)) return;
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    const double scale = params.scale_by_std ? detail::reciprocal_or_zero(std_dev + params.eps) : 1.0;
    for (index_t j = 0; j < g.size; ++j) out[j] = (static_cast<double>(g.rewards[j]) - mean) * scale;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats&) const { return a; }
};

RECO_NAMESPACE_END
