// selectable_kl: the KL term switched on or off at run time ("kl.kind" of a composition, and the
// adapters' way of adding a KL term by key to a preset that has none): off, it reads nothing and
// adds nothing, exactly as reco::no_kl; on, it is reco::kl_penalty with its parameters.
#pragma once

#include <cstdint>
#include <string>

#include "reco/component.hpp"
#include "reco/kl/no_kl.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct selectable_kl {
  using role = roles::kl_term;
  static constexpr bool selectable = true;
  static constexpr bool active = true;  // may be on: on() says
  struct params_type {
    bool on = false;
    kl_penalty term;
  };
  params_type params{};

  // The selectable form of the fixed term: off for no_kl, on with the parameters of kl_penalty.
  static selectable_kl from(const selectable_kl& s) { return s; }
  static selectable_kl from(const no_kl&) { return {}; }
  static selectable_kl from(const kl_penalty& t) {
    selectable_kl s;
    s.params.on = true;
    s.params.term = t;
    return s;
  }

  // kl_penalty's fields, only while on (a key of a term that is off would be ignored).
  template <class V>
  static void fields(params_type& p, V&& v) {
    if (p.on) kl_penalty::fields(p.term.params, v);
  }
  void validate(const std::string& name) const {
    if (params.on) params.term.validate(name);
  }
  RECO_HOST_DEVICE bool on() const { return params.on; }
};

RECO_NAMESPACE_END
