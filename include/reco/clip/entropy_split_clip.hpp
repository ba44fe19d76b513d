// ASPO reference code's entropy-split clip range: within each response, tokens whose entropy is
// above the response's `percentile` entropy quantile (linear interpolation over its valid tokens,
// torch.quantile's rule) use the wide range (0.4), the others the base range (0.2). Everything
// else is ppo_clip, dual clip included.
#pragma once

#include <string>

#include "reco/clip/ppo_clip.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

struct entropy_split_clip {
  using role = roles::clip_policy;
  struct params_type {
    double eps_low = 0.2;
    double eps_high = 0.2;
    double high_entropy_eps_low = 0.4;
    double high_entropy_eps_high = 0.4;
    double percentile = 0.8;  // in [0, 1]
    dual_clip_mode dual_clip = dual_clip_mode::off;
    double dual_clip_c = 3.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("eps_low", p.eps_low);
    v("eps_high", p.eps_high);
    v("high_entropy_eps_low", p.high_entropy_eps_low);
    v("high_entropy_eps_high", p.high_entropy_eps_high);
    v("percentile", p.percentile);
    v("dual_clip", p.dual_clip);
    v("dual_clip_c", p.dual_clip_c);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.eps_low >= 0 && params.eps_low <= 1, name, "eps_low", "must be in [0, 1]");
    check_param(finite_param(params.eps_high) && params.eps_high >= 0, name, "eps_high", "must be finite and >= 0");
    check_param(params.high_entropy_eps_low >= 0 && params.high_entropy_eps_low <= 1, name, "high_entropy_eps_low", "must be in [0, 1]");
    check_param(finite_param(params.high_entropy_eps_high) && params.high_entropy_eps_high >= 0, name, "high_entropy_eps_high", "must be finite and >= 0");
    check_param(params.percentile >= 0 && params.percentile <= 1, name, "percentile", "must be in [0, 1]");
    check_param(params.dual_clip == dual_clip_mode::off || (finite_param(params.dual_clip_c) && params.dual_clip_c > 1), name, "dual_clip_c", "must be finite and > 1 when the dual clip is on");
  }

  static constexpr bool needs_entropy = true;
  static constexpr bool needs_entropy_quantile = true;
  static constexpr bool clips = true;
  // The entropy quantile each response's tokens are compared with.
  RECO_HOST_DEVICE double percentile() const { return params.percentile; }

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> apply(const basic_ratio_value<V>& rv,
                                                  const basic_token_context<V>& c) const {
    const detail::mask_t<V> high = c.entropy > c.entropy_quantile;
    return detail::ppo_surrogate(rv, c, detail::select(high, V(params.high_entropy_eps_low), V(params.eps_low)),
                                 detail::select(high, V(params.high_entropy_eps_high), V(params.eps_high)),
                                 params.dual_clip, params.dual_clip_c);
  }
};

RECO_NAMESPACE_END
