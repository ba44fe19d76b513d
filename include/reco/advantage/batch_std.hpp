// Group mean, batch std (PPO-Lite / "Tricks or Traps"): A_i = (s_i - mean_g) / (std_batch + eps),
// std_batch the unbiased std of all rewards in the batch passed in.
#pragma once

#include <cmath>

#include <string>

#include "reco/advantage/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct batch_std_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    double eps = 1e-6;  // added to the batch std so that an all-equal batch gives A = 0
    singleton_policy singleton = singleton_policy::zero;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
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
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::reward_std;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    if (detail::handle_singleton(g, params.singleton, 1.0, out, status)) return;
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    for (index_t j = 0; j < g.size; ++j) out[j] = static_cast<double>(g.rewards[j]) - mean;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats& s) const {
    // 0 / 0 (an all-equal batch with eps = 0) is 0, as for grpo_advantage.
    return a == 0 ? 0.0 : a / (::sqrt(s.reward_var) + params.eps);
  }
};

RECO_NAMESPACE_END
