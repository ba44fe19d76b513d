// No KL term.
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct no_kl {
  using role = roles::kl_term;
  struct params_type {};
  params_type params{};
  static constexpr bool active = false;
};

RECO_NAMESPACE_END
