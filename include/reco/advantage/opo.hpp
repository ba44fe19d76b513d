// OPO's length-weighted baseline: A_i = s_i - sum_j |o_j| s_j / sum_j |o_j| within the group.
// A group whose responses are all empty falls back to the plain mean.
#pragma once

#include "reco/advantage/common.hpp"

RECO_NAMESPACE_BEGIN

struct opo_advantage {
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
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::none;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    if (detail::handle_singleton(g, params.singleton, 1.0, out, status)) return;
    double num = 0, den = 0, plain = 0;
    for (index_t j = 0; j < g.size; ++j) {
      const double s = static_cast<double>(g.rewards[j]);
      const double n = static_cast<double>(g.lengths[j]);
      num += n * s;
      den += n;
      plain += s;
    }
    const double baseline = den > 0 ? num / den : plain / static_cast<double>(g.size);
    for (index_t j = 0; j < g.size; ++j) out[j] = static_cast<double>(g.rewards[j]) - baseline;
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats&) const { return a; }
};

RECO_NAMESPACE_END
