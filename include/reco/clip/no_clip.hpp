// No clipping: loss -A S(x), gradient -A omega. Required by ratio forms that carry their own
// clipping or none (reinforce_ratio, cispo_ratio, sapo_ratio) and used by GMPO.
#pragma once

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

struct no_clip {
  using role = roles::clip_policy;
  struct params_type {};
  params_type params{};

  static constexpr bool needs_entropy = false;
  static constexpr bool needs_entropy_quantile = false;
  static constexpr bool clips = false;

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> apply(const basic_ratio_value<V>& rv,
                                                  const basic_token_context<V>& c) const {
    basic_surrogate_value<V> s;
    s.x = rv.x;
    s.loss = -c.advantage * (rv.reciprocal ? V(1.0) / rv.x : rv.x);
    s.grad = -c.advantage * rv.omega;
    s.clipped = rv.clipped && c.advantage != 0;
    return s;
  }
};

RECO_NAMESPACE_END
