// token_mean (DAPO): L = sum_t m_t l_t / N_tok; c_it = 1 / N_tok. N_tok is the local count of the
// term's tokens unless the caller passes a global count in reco::normalisers.
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct token_mean {
  using role = roles::loss_aggregator;
  struct params_type {};
  params_type params{};

  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t) const {
    return n.tokens > 0 ? 1.0 / n.tokens : 0.0;
  }
};

RECO_NAMESPACE_END
