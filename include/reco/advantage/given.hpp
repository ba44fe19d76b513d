// Advantages computed by the caller: A_i = batch.advantages[i], used as given.
#pragma once

#include "reco/advantage/common.hpp"

RECO_NAMESPACE_BEGIN

struct given_advantage {
  using role = roles::advantage_estimator;
  struct params_type {};
  params_type params{};

  static constexpr advantage_input input = advantage_input::advantages;
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::none;

  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t&) const {
    for (index_t j = 0; j < g.size; ++j) out[j] = static_cast<double>(g.rewards[j]);
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats&) const { return a; }
};

RECO_NAMESPACE_END
