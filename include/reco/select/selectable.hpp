// selectable_select: the token selector switched at run time ("select" slot of a composition):
// all tokens (exactly reco::all_tokens) or the top-entropy selection of the 80/20 rule with its
// parameters. Covariance selection (clip_cov / kl_cov) constrains the ratio form and stays a
// fixed component (its presets).
#pragma once

#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/select/all_tokens.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_select : detail::switched_term<selectable_select, top_entropy_selection, all_tokens> {
  using role = roles::token_selector;
};

RECO_NAMESPACE_END
