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
// q (1 - q) for q = exp(logq), floored: 1 - q from 1 - exp when q < 1/2 (no cancellation there)
// and from -expm1 above, so that it is exact as q -> 1. q = 0 and q = 1 give the floor.
RECO_HOST_DEVICE inline double bernoulli_variance(double logq, double floor) {
  const double q = ::exp(logq);
  const double one_minus_q = q < 0.5 ? 1.0 - q : -::expm1(logq);
  const double v = q * one_minus_q;
  return v > floor ? v : floor;
}
// A value is "inside a clamp" when the clamp does not bite: its derivative passes through.
RECO_HOST_DEVICE inline bool inside(double x, double lo, double hi) { return x >= lo && x <= hi; }

}  // namespace detail
RECO_NAMESPACE_END
