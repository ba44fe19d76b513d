// Pass@k advantage (verl's grpo_passk): only the best response of a group gets a signal,
// A_best = s_max - s_second (divided by std_g + eps by default, as in verl); the others get 0.
// The best is the first response holding the maximum; ties give A = 0 everywhere.
#pragma once

#include <string>

#include "reco/advantage/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct pass_at_k_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    bool scale_by_std = true;
    double eps = 1e-6;
    singleton_policy singleton = singleton_policy::zero;  // the estimator needs G >= 2
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("scale_by_std", p.scale_by_std);
    v("eps", p.eps);
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
    index_t best = 0;
    for (index_t j = 1; j < g.size; ++j)
      if (static_cast<double>(g.rewards[j]) > static_cast<double>(g.rewards[best])) best = j;
    bool have_second = false;
    double second = 0;
    for (index_t j = 0; j < g.size; ++j) {
      if (j == best) continue;
      const double s = static_cast<double>(g.rewards[j]);
      if (!have_second || s > second) second = s;
      have_second = true;
    }
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    const double scale = params.scale_by_std ? detail::reciprocal_or_zero(std_dev + params.eps) : 1.0;
    for (index_t j = 0; j < g.size; ++j) out[j] = 0.0;
    out[best] = (static_cast<double>(g.rewards[best]) - second) * scale;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats&) const { return a; }
};

RECO_NAMESPACE_END
