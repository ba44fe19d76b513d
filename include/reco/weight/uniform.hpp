// Every response weighs 1 (GRPO).
#pragma once

#include "reco/weight/common.hpp"

RECO_NAMESPACE_BEGIN

struct uniform_weight {
  using role = roles::response_weighter;
  struct params_type {};
  params_type params{};

  static constexpr bool needs_old_logp_mean = false;
  static constexpr bool reads_response_weights = false;
  static constexpr bool is_uniform = true;

  RECO_HOST_DEVICE double raw(const response_context&) const { return 1.0; }
  RECO_HOST_DEVICE double cap() const { return 0.0; }  // 0: no cap
  RECO_HOST_DEVICE weight_normalisation normalisation() const { return weight_normalisation::none; }
};

RECO_NAMESPACE_END
