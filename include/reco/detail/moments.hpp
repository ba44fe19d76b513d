// Mergeable weighted moments (Chan et al.'s parallel update), so that batch statistics are one
// deterministic reduction and never suffer the cancellation of sum-of-squares formulas.
#pragma once

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

struct moments {
  double weight = 0;  // sum of weights (a count when every weight is 1)
  double mean = 0;
  double m2 = 0;      // sum of w (x - mean)^2

  RECO_HOST_DEVICE static moments of(double x, double w = 1.0) {
    moments m;
    if (w > 0) {
      m.weight = w;
      m.mean = x;
    }
    return m;
  }
  RECO_HOST_DEVICE static moments merge(const moments& a, const moments& b) {
    if (a.weight == 0) return b;
    if (b.weight == 0) return a;
    moments r;
    r.weight = a.weight + b.weight;
    const double delta = b.mean - a.mean;
    r.mean = a.mean + delta * (b.weight / r.weight);
    r.m2 = a.m2 + b.m2 + delta * delta * (a.weight * b.weight / r.weight);
    return r;
  }
  // Unbiased (n - 1) variance for unit weights; 0 when fewer than two observations.
  RECO_HOST_DEVICE double variance_unbiased() const { return weight > 1 ? m2 / (weight - 1) : 0.0; }
  RECO_HOST_DEVICE double variance_biased() const { return weight > 0 ? m2 / weight : 0.0; }
};

}  // namespace detail
RECO_NAMESPACE_END
