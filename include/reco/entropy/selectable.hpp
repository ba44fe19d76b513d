// selectable_entropy: the entropy bonus switched on or off at run time ("entropy.kind" of a
// composition): off, exactly reco::no_entropy_bonus; on, reco::entropy_bonus with its coefficient.
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/entropy/no_entropy_bonus.hpp"
#include "reco/entropy/entropy_bonus.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_entropy {
  using role = roles::entropy_term;
  static constexpr bool selectable = true;
  static constexpr bool active = true;  // may be on: on() says
  struct params_type {
    bool on = false;
    entropy_bonus term;
  };
  params_type params{};

  // The selectable form of the fixed term: off for no_entropy_bonus, on with the parameters of entropy_bonus.
  static selectable_entropy from(const selectable_entropy& s) { return s; }
  static selectable_entropy from(const no_entropy_bonus&) { return {}; }
  static selectable_entropy from(const entropy_bonus& t) {
    selectable_entropy s;
    s.params.on = true;
    s.params.term = t;
    return s;
  }

  template <class V>
  static void fields(params_type& p, V&& v) {
    if (p.on) entropy_bonus::fields(p.term.params, v);
  }
  void validate(const std::string& name) const {
    if (params.on) params.term.validate(name);
  }
  RECO_HOST_DEVICE bool on() const { return params.on; }
};

RECO_NAMESPACE_END
