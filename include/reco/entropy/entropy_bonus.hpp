// Entropy bonus: adds -coef * aggregate(H) to the loss (maximising entropy), aggregated like the
// other terms over valid tokens; d loss / d H_t = -coef c_t. The trainer back-propagates the
// entropy gradient through its logits (reco::token_logp_entropy does).
#pragma once

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct entropy_bonus {
  using role = roles::entropy_term;
  struct params_type {
    double coef = 0.001;  // verl's former default entropy coefficient
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("coef", p.coef);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.coef), name, "coef", "must be finite");
  }
  static constexpr bool active = true;
};

RECO_NAMESPACE_END
