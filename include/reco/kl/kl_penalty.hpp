// KL to the reference policy, d = logp - ref_logp, added as + beta * aggregate(kl):
//   k1 = d;  abs = |d|;  k2 = d^2 / 2;  k3 = exp(-d) + d - 1 (low-variance, Schulman).
// k3 is clamped as in verl and OpenRLHF by default: -d to [-20, 20] before exp and the result to
// [-10, 10], with derivative 0 where a clamp bites (TRL does not clamp: clamp = false).
// d k3 / d logp = 1 - exp(-d). straight_through keeps the chosen estimator's value but takes the
// gradient of k2 (= d), verl's "k3+" style.
#pragma once

#include <cmath>
#include <cstdint>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

enum class kl_estimator : std::uint8_t { k1, abs, k2, k3 };

struct kl_penalty {
  using role = roles::kl_term;
  struct params_type {
    kl_estimator estimator = kl_estimator::k3;
    double beta = 0.001;  // the paper's KL coefficient
    bool clamp = true;
    bool straight_through = false;
  };
  params_type params{};

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(finite_param(params.beta) && params.beta >= 0, name, "beta", "must be finite and >= 0");
  }
  static constexpr bool active = true;

  RECO_HOST_DEVICE kl_value eval(double logp, double ref_logp) const {
    const double d = logp - ref_logp;
    kl_value k;
    switch (params.estimator) {
      case kl_estimator::k1: k = {d, 1.0}; break;
      case kl_estimator::abs: k = {d < 0 ? -d : d, detail::sign(d)}; break;
      case kl_estimator::k2: k = {0.5 * d * d, d}; break;
      case kl_estimator::k3: {
        double e = -d;
        bool passes = true;
        if (params.clamp && (e > 20.0 || e < -20.0)) {
          e = detail::clampd(e, -20.0, 20.0);
          passes = false;
        }
        // exp(e) - e - 1 written as expm1(e) - e: no cancellation for small |d|.
        const double em1 = ::expm1(e);
        double v = em1 - e;
        if (params.clamp && (v > 10.0 || v < -10.0)) {
          v = detail::clampd(v, -10.0, 10.0);
          passes = false;
        }
        k = {v, passes ? -em1 : 0.0};
        break;
      }
    }
    if (params.straight_through) k.grad = d;
    return k;
  }
};

RECO_NAMESPACE_END
