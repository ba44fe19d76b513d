// GPG: A_i = alpha (s_i - mean_g) with alpha = R / max(#{i : s_i != 0}, 1) over the batch passed in.
#pragma once

#include "reco/advantage/common.hpp"

RECO_NAMESPACE_BEGIN

struct gpg_advantage {
  using role = roles::advantage_estimator;
  struct params_type {
    singleton_policy singleton = singleton_policy::zero;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("singleton", p.singleton);
  }

  static constexpr advantage_input input = advantage_input::rewards;
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::nonzero_scale;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    if (detail::handle_singleton(g, params.singleton, 1.0, out, status)) return;
    double mean, std_dev;
    detail::group_mean_std(g, mean, std_dev);
    for (index_t j = 0; j < g.size; ++j) out[j] = static_cast<double>(g.rewards[j]) - mean;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats& s) const {
    const double nonzero = s.nonzero_rewards > 1 ? s.nonzero_rewards : 1.0;
    return s.reward_count / nonzero * a;
  }
};

RECO_NAMESPACE_END
