// Every valid token takes part in the policy-gradient term (no selection).
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct all_tokens {
  using role = roles::token_selector;
  struct params_type {};
  params_type params{};
  static constexpr bool active = false;
};

RECO_NAMESPACE_END
