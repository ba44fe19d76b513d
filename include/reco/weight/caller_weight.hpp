// Per-response weights supplied by the caller in batch.response_weights (for example importance
// weights for a training/inference mismatch at the response level). Per-token rollout weights go
// in batch.token_weights instead and multiply the policy term with any weighter.
#pragma once

#include <string>

#include "reco/weight/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct caller_weight {
  using role = roles::response_weighter;
  struct params_type {
    double cap = 0.0;  // optional cap on the given weights; <= 0: none
    weight_normalisation normalise = weight_normalisation::none;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("cap", p.cap);
    v("normalise", p.normalise);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(!(params.cap != params.cap), name, "cap", "must not be NaN (<= 0 disables the cap)");
  }

  static constexpr bool needs_old_logp_mean = false;
  static constexpr bool reads_response_weights = true;
  static constexpr bool is_uniform = false;

  RECO_HOST_DEVICE double raw(const response_context& r) const {
    return r.length == 0 ? 0.0 : r.given_weight;
  }
  RECO_HOST_DEVICE double cap() const { return params.cap; }
  RECO_HOST_DEVICE weight_normalisation normalisation() const { return params.normalise; }
};

RECO_NAMESPACE_END
