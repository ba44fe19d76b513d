// REINFORCE leave-one-out: A_i = s_i - mean of the other responses = G/(G-1) (s_i - mean_g).
#pragma once

#include "reco/advantage/common.hpp"

RECO_NAMESPACE_BEGIN

struct rloo_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    singleton_policy singleton = singleton_policy::zero;  // raw_score gives A = s
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("singleton", p.singleton);
  }

  static constexpr advantage_input input = advantage_input::rewards;
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::none;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    if (detail::handle_singleton(g, params.singleton, 1.0, out, status)) return;
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    const double n = static_cast<double>(g.size);
    for (index_t j = 0; j < g.size; ++j)
      out[j] = n / (n - 1.0) * (static_cast<double>(g.rewards[j]) - mean);
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats&) const { return a; }
};

RECO_NAMESPACE_END
