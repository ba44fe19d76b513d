// DPPO (Divergence PPO; verl's loss_mode "dppo_tv" / "dppo_kl"): REINFORCE with the ratio
// truncated at c and detached, and a trust region on the sampled token's probability in place of
// the ratio clip:
//   loss = -A sg(min(r, c)) logp [inside],   d loss / d logp = -A min(r, c) [inside]
// with p = exp(logp), p_old = exp(old_logp) and the region ([inside] detached; A > 0 bounds the
// rise of p, A <= 0 its fall):
//   tv:        A > 0: p - p_old <= eps_high;             A <= 0: p - p_old >= -eps_low
//   binary_kl: D = p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
//              (the KL between the Bernoulli laws of the token; 1e-8 as verl);
//              A > 0: D <= eps_high or p <= p_old;       A <= 0: D <= eps_low or p >= p_old
// Tokens outside the region count as clipped. Defaults: eps 0.2 both sides, c = 20 (verl's loss
// function without a clip_ratio_c; the peer presets verl_dppo_tv / verl_dppo_kl take
// ActorConfig's 3). Carries its own clipping: compose with no_clip.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/ratio/token.hpp"

RECO_NAMESPACE_BEGIN

enum class dppo_divergence : std::uint8_t { tv, binary_kl };
constexpr choice_labels<2> labels_of(dppo_divergence) { return {{"tv", "binary_kl"}}; }

struct dppo_ratio {
  using role = roles::ratio_form;
  struct params_type {
    dppo_divergence divergence = dppo_divergence::tv;
    double eps_low = 0.2;
    double eps_high = 0.2;
    double truncation = 20.0;  // c
    double log_ratio_clamp = 20.0;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("divergence", p.divergence);
    v("eps_low", p.eps_low);
    v("eps_high", p.eps_high);
    v("truncation", p.truncation);
    v("log_ratio_clamp", p.log_ratio_clamp);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.eps_low) && params.eps_low >= 0, name, "eps_low", "must be finite and >= 0");
    check_param(finite_param(params.eps_high) && params.eps_high >= 0, name, "eps_high", "must be finite and >= 0");
    check_param(finite_param(params.truncation) && params.truncation > 0, name, "truncation",
                "must be finite and > 0");
    check_param(finite_param(params.log_ratio_clamp) && params.log_ratio_clamp >= 0, name, "log_ratio_clamp",
                "must be finite and >= 0 (0 disables the clamp)");
  }

  static constexpr ratio_scope scope = ratio_scope::token;
  static constexpr bool self_clipped = true;

  // Whether the token (each lane of a pack) lies inside the trust region for an advantage of
  // this sign.
  template <class V>
  RECO_TOKEN_MATH detail::mask_t<V> inside(const V& logp, const V& old_logp, bool positive) const {
    const V p = detail::vexp(logp), p_old = detail::vexp(old_logp);
    if (params.divergence == dppo_divergence::tv)
      return positive ? p - p_old <= V(params.eps_high) : p - p_old >= V(-params.eps_low);
    // In float, 1 - p from expm1 (1 - p rounded at p -> 1 would be off by more than the 1e-8).
    V q_old = V(1.0) - p_old, q = V(1.0) - p;
    if constexpr (detail::single_precision_v<V>) {
      q_old = detail::one_minus_exp(old_logp, p_old);
      q = detail::one_minus_exp(logp, p);
    }
    const V d = p_old * (old_logp - logp) + q_old * detail::vlog((q_old + V(1e-8)) / (q + V(1e-8)));
    return positive ? (d <= V(params.eps_high) || p <= p_old) : (d <= V(params.eps_low) || p >= p_old);
  }

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate(const basic_token_context<V>& c) const {
    detail::mask_t<V> passes;
    basic_surrogate_value<V> s;
    s.x = detail::clamped_exp(c.logp - c.old_logp, params.log_ratio_clamp, passes);
    const V w = detail::mind(s.x, V(params.truncation));
    const detail::mask_t<V> in = inside(c.logp, c.old_logp, c.advantage > 0);
    s.clipped = !in && c.advantage != 0;
    s.loss = detail::select(in, -w * c.advantage * c.logp, V(0.0));
    s.grad = detail::select(in, V(-c.advantage) * w, V(0.0));
    return s;
  }
};

RECO_NAMESPACE_END
