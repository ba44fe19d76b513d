// One token's value in float: the value type the fused CUDA kernels (and their host emulation)
// run the per-token body on for float inputs, so that each term is computed in float, as the
// CPU's packed pass computes it on packs of floats (docs/conventions.md, "Precision"). Like a
// pack, a double constant or per-response value meeting it is rounded to float first, so no
// term silently widens to double; truth values are plain bools.
#pragma once

#include <cmath>

#include "reco/config.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

struct float_lane {
  float v = 0.0f;
  RECO_HOST_DEVICE float_lane() {}
  RECO_HOST_DEVICE float_lane(double d) : v(static_cast<float>(d)) {}  // NOLINT: as a pack's broadcast
  RECO_HOST_DEVICE static float_lane of(float f) {
    float_lane x;
    x.v = f;
    return x;
  }
  RECO_HOST_DEVICE explicit operator double() const { return v; }

  friend RECO_HOST_DEVICE float_lane operator+(const float_lane& a, const float_lane& b) { return of(a.v + b.v); }
  friend RECO_HOST_DEVICE float_lane operator-(const float_lane& a, const float_lane& b) { return of(a.v - b.v); }
  friend RECO_HOST_DEVICE float_lane operator*(const float_lane& a, const float_lane& b) { return of(a.v * b.v); }
  friend RECO_HOST_DEVICE float_lane operator/(const float_lane& a, const float_lane& b) { return of(a.v / b.v); }
  friend RECO_HOST_DEVICE float_lane operator-(const float_lane& a) { return of(-a.v); }
  RECO_HOST_DEVICE float_lane& operator+=(const float_lane& b) {
    v += b.v;
    return *this;
  }
  friend RECO_HOST_DEVICE bool operator<(const float_lane& a, const float_lane& b) { return a.v < b.v; }
  friend RECO_HOST_DEVICE bool operator>(const float_lane& a, const float_lane& b) { return a.v > b.v; }
  friend RECO_HOST_DEVICE bool operator<=(const float_lane& a, const float_lane& b) { return a.v <= b.v; }
  friend RECO_HOST_DEVICE bool operator>=(const float_lane& a, const float_lane& b) { return a.v >= b.v; }
  friend RECO_HOST_DEVICE bool operator==(const float_lane& a, const float_lane& b) { return a.v == b.v; }
  friend RECO_HOST_DEVICE bool operator!=(const float_lane& a, const float_lane& b) { return a.v != b.v; }
};

template <>
struct lanes<float_lane> {
  using V = float_lane;
  using mask = bool;
  RECO_HOST_DEVICE static V select(bool m, const V& a, const V& b) { return m ? a : b; }
  RECO_HOST_DEVICE static V min(const V& a, const V& b) { return b.v < a.v ? b : a; }
  RECO_HOST_DEVICE static V max(const V& a, const V& b) { return a.v < b.v ? b : a; }
  RECO_HOST_DEVICE static bool any(bool m) { return m; }
  RECO_HOST_DEVICE static V exp(const V& x) { return V::of(::expf(x.v)); }
  RECO_HOST_DEVICE static V exp_within(const V& x) { return exp(x); }
  RECO_HOST_DEVICE static V expm1(const V& x) { return V::of(::expm1f(x.v)); }
  RECO_HOST_DEVICE static V log(const V& x) { return V::of(::logf(x.v)); }
  // As the float packs' form (reco/backend/cpu/simd.hpp): 1 - q from expm1 above q = 1/2, and a
  // floor of at least the smallest normal float, so a floored variance is never subnormal.
  RECO_HOST_DEVICE static V bernoulli_variance(const V& logq, double floor) {
    const float q = ::expf(logq.v);
    const float one_minus_q = q < 0.5f ? 1.0f - q : -::expm1f(logq.v);
    const float v = q * one_minus_q;
    const float f = static_cast<float>(floor > 0x1p-126 ? floor : 0x1p-126);
    return V::of(v > f ? v : f);
  }
  // expm1(x) into em1 and expm1(x) - x: below |x| = ln2 / 2 the series x^2 (1/2 + x/6 + ...) to
  // degree 7 itself (a third of an ulp of truncation there), where the difference would cancel;
  // beyond, expm1(x) and x differ by at least a tenth of |x|.
  RECO_HOST_DEVICE static V expm1_excess(const V& x, V& em1) {
    const float r = x.v;
    em1 = V::of(::expm1f(r));
    if (r > -0.34657359f && r < 0.34657359f) {
      const float r2 = r * r;
      const float q = (0.5f + r * (1.0f / 6)) + r2 * ((1.0f / 24 + r * (1.0f / 120)) + r2 * (1.0f / 720 + r * (1.0f / 5040)));
      return V::of(r2 * q);
    }
    return V::of(em1.v - r);
  }
  RECO_HOST_DEVICE static V expm1_excess_within(const V& x, V& em1) { return expm1_excess(x, em1); }
  static constexpr bool single_precision = true;
};

}  // namespace detail
RECO_NAMESPACE_END
