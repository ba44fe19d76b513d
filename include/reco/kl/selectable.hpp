// selectable_kl: the KL term switched on or off at run time ("kl" slot of a composition, and the
// adapters' way of adding a KL term by key to a preset that has none): off, it reads nothing and
// adds nothing, exactly as reco::no_kl; on, it is reco::kl_penalty with its parameters.
#pragma once

#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/kl/no_kl.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_kl : detail::switched_term<selectable_kl, kl_penalty, no_kl> {
  using role = roles::kl_term;
};

RECO_NAMESPACE_END
