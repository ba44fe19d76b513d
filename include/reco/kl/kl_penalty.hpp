// KL to the reference policy, d = logp - ref_logp, added as + beta * aggregate(kl):
//   k1 = d;  abs = |d|;  k2 = d^2 / 2;  k3 = exp(-d) + d - 1 (low-variance, Schulman).
// k3 is clamped as in verl and OpenRLHF by default: -d to [-20, 20] before exp and the result to
// [-10, 10], with derivative 0 where a clamp bites (TRL does not clamp: clamp = false).
// d k3 / d logp = 1 - exp(-d). straight_through keeps the chosen estimator's value but takes the
// gradient of k2 (= d), verl's "k3+" style. importance_weighted multiplies the estimator by the
// token ratio r = exp(logp - old_logp), not detached (TRL's use_bias_correction_kl at its default
// token-level importance sampling): value k r, d / d logp = (k' + k) r, r unclamped as in TRL.
#pragma once

#include <cmath>
#include <cstdint>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

enum class kl_estimator : std::uint8_t { k1, abs, k2, k3 };
constexpr choice_labels<4> labels_of(kl_estimator) { return {{"k1", "abs", "k2", "k3"}}; }

struct kl_penalty {
  using role = roles::kl_term;
  struct params_type {
    kl_estimator estimator = kl_estimator::k3;
    double beta = 0.001;  // the paper's KL coefficient
    bool clamp = true;
    bool straight_through = false;
    bool importance_weighted = false;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("beta", p.beta);
    v("estimator", p.estimator);
    v("clamp", p.clamp);
    v("straight_through", p.straight_through);
    v("importance_weighted", p.importance_weighted);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.beta) && params.beta >= 0, name, "beta", "must be finite and >= 0");
  }
  static constexpr bool active = true;

  RECO_HOST_DEVICE kl_value eval(double logp, double ref_logp) const { return estimate(logp, ref_logp); }
  // The same on a pack of tokens (reco/backend/cpu/simd.hpp); V = double is eval above.
  template <class V>
  RECO_TOKEN_MATH basic_kl_value<V> estimate(const V& logp, const V& ref_logp) const {
    using mask = detail::mask_t<V>;
    const V d = logp - ref_logp;
    // The value and gradient as values, the struct built once at the end: assigned as a struct
    // in each case, g++ kept it in memory (a store and a load per field and pack).
    V value = d, grad = V(1.0);  // k1
    switch (params.estimator) {
      case kl_estimator::k1: break;
      case kl_estimator::abs:
        value = detail::select(d < 0, -d, d);
        grad = detail::sign(d);
        break;
      case kl_estimator::k2:
        value = 0.5 * d * d;
        grad = d;
        break;
      case kl_estimator::k3: {
        V e = -d;
        mask passes = true;
        if (params.clamp) {
          const V ec = detail::clampd(e, -20.0, 20.0);
          passes = ec == e;
          e = ec;
        }
        // exp(e) - e - 1 written as expm1(e) - e: no cancellation for small |d| (in float too).
        V em1;
        if (params.clamp) {
          // Within the clamp the exponential needs no range clamp of its own; k3 >= 0, so of the
          // clamp to [-10, 10] only the upper bound can bite.
          value = detail::vexpm1_excess_within(e, em1);
          const V vc = detail::mind(value, V(10.0));
          passes = passes && vc == value;
          value = vc;
        } else {
          value = detail::vexpm1_excess(e, em1);
        }
        grad = detail::select(passes, -em1, V(0.0));
        break;
      }
    }
    if (params.straight_through) grad = d;
    return {value, grad};
  }

  // The estimate at a token whose log-ratio to the sampling policy is `log_ratio` (the objective
  // calls this after estimate / eval): unchanged unless importance_weighted.
  template <class V>
  RECO_TOKEN_MATH basic_kl_value<V> reweight(const basic_kl_value<V>& k, const V& log_ratio) const {
    V value = k.value, grad = k.grad;
    if (params.importance_weighted) {
      const V r = detail::vexp(log_ratio);
      grad = (grad + value) * r;
      value = value * r;
    }
    return {value, grad};
  }
};

RECO_NAMESPACE_END
