// seq_mean_token_sum_all (LUSPO, TRL loss_type "luspo"): each response's token sum, averaged over
// all R responses passed in, empty ones included: c_it = 1 / R. It differs from
// seq_mean_token_sum (1 / R', non-empty responses) only when a response has no valid token.
// With a sequence ratio the per-token form gives LUSPO's length-scaled sequence loss
// (1 / R) sum_i |o_i| l_i. R is the local count (TRL takes the mean over its local batch).
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct seq_mean_token_sum_all {
  using role = roles::loss_aggregator;
  struct params_type {};
  params_type params{};

  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t) const {
    return n.all_responses > 0 ? 1.0 / n.all_responses : 0.0;
  }
};

RECO_NAMESPACE_END
