// selectable_entropy: the entropy bonus switched on or off at run time ("entropy" slot of a
// composition): off, exactly reco::no_entropy_bonus; on, reco::entropy_bonus with its coefficient.
#pragma once

#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/entropy/entropy_bonus.hpp"
#include "reco/entropy/no_entropy_bonus.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_entropy : detail::switched_term<selectable_entropy, entropy_bonus, no_entropy_bonus> {
  using role = roles::entropy_term;
};

RECO_NAMESPACE_END
