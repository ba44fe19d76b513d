// seq_mean_token_mean (GRPO, the ReCo paper): the mean over non-empty responses of each
// response's token mean; c_it = 1 / (R' |o_i|).
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct seq_mean_token_mean {
  using role = roles::loss_aggregator;
  struct params_type {};
  params_type params{};

  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t response_tokens) const {
    return (n.responses > 0 && response_tokens > 0)
               ? 1.0 / (n.responses * static_cast<double>(response_tokens))
               : 0.0;
  }
};

RECO_NAMESPACE_END
