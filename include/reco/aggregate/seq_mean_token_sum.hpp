// seq_mean_token_sum: the mean over non-empty responses of each response's token sum; c_it = 1 / R'.
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct seq_mean_token_sum {
  using role = roles::loss_aggregator;
  struct params_type {};
  params_type params{};

  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t) const {
    return n.responses > 0 ? 1.0 / n.responses : 0.0;
  }
};

RECO_NAMESPACE_END
