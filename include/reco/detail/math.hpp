// Scalar helpers shared by the components; all in double, all host/device.
#pragma once

#include <cmath>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

RECO_HOST_DEVICE inline double clampd(double x, double lo, double hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
RECO_HOST_DEVICE inline double mind(double a, double b) { return b < a ? b : a; }
RECO_HOST_DEVICE inline double maxd(double a, double b) { return a < b ? b : a; }
// False for NaN and +-inf without relying on <cmath> overloads in device code.
RECO_HOST_DEVICE inline bool finite(double x) { return x - x == 0.0; }
RECO_HOST_DEVICE inline double sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
RECO_HOST_DEVICE inline double sigmoid(double x) {
  // Split by sign so exp never overflows.
  if (x >= 0) return 1.0 / (1.0 + ::exp(-x));
  const double e = ::exp(x);
  return e / (1.0 + e);
}
// log(q (1 - q)) for q = exp(logq), floored at log_floor; exact near q -> 1 through expm1 and
// well defined (the floor) at q = 0 and q = 1.
RECO_HOST_DEVICE inline double log_bernoulli_variance(double logq, double log_floor) {
  const double one_minus_q = -::expm1(logq);
  if (!(one_minus_q > 0.0)) return log_floor;  // q >= 1 (or NaN): saturated
  const double v = logq + ::log(one_minus_q);
  return v > log_floor ? v : log_floor;
}
// A value is "inside a clamp" when the clamp does not bite: its derivative passes through.
RECO_HOST_DEVICE inline bool inside(double x, double lo, double hi) { return x >= lo && x <= hi; }

}  // namespace detail
RECO_NAMESPACE_END
