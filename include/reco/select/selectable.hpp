// selectable_select: the token selector switched at run time ("select.kind" of a composition):
// all tokens (exactly reco::all_tokens) or the top-entropy selection of the 80/20 rule with its
// parameters. Covariance selection (clip_cov / kl_cov) constrains the ratio form and stays a
// fixed component (its presets).
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/select/all_tokens.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_select {
  using role = roles::token_selector;
  static constexpr bool selectable = true;
  static constexpr bool active = true;  // may select: on() says
  struct params_type {
    bool on = false;
    top_entropy_selection term;
  };
  params_type params{};

  // The selectable form of the fixed term: off for all_tokens, on with the parameters of top_entropy_selection.
  static selectable_select from(const selectable_select& s) { return s; }
  static selectable_select from(const all_tokens&) { return {}; }
  static selectable_select from(const top_entropy_selection& t) {
    selectable_select s;
    s.params.on = true;
    s.params.term = t;
    return s;
  }

  template <class V>
  static void fields(params_type& p, V&& v) {
    if (p.on) top_entropy_selection::fields(p.term.params, v);
  }
  void validate(const std::string& name) const {
    if (params.on) params.term.validate(name);
  }
  RECO_HOST_DEVICE bool on() const { return params.on; }
};

RECO_NAMESPACE_END
