// No entropy term.
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct no_entropy_bonus {
  using role = roles::entropy_term;
  struct params_type {};
  params_type params{};
  static constexpr bool active = false;
};

RECO_NAMESPACE_END
