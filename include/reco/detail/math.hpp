// Helpers shared by the components, host and device. The per-token math is written once over a
// value type V: double (one token; host and device), or a pack of doubles holding several tokens
// of one response (the CPU backend's vectorised token pass, reco/backend/cpu/simd.hpp). lanes<V> says
// how to choose and exponentiate on V; a branch on a per-token value is written
// select(mask, a, b), which for double is the plain conditional expression.
#pragma once

#include <cmath>
#include <type_traits>
#include <utility>

#include "reco/config.hpp"

// The per-token math's functions (those written over V): host and device, and always inlined by
// host compilers, so that the CPU's wide variants compiled for another instruction set
// (reco/backend/cpu/simd.hpp) never call one of them, which would pass packs with another calling
// convention. RECO_NO_FORCE_INLINE (only with RECO_NO_SIMD_DISPATCH, for unoptimised sanitizer
// builds) leaves inlining to the compiler: at -O0 the forced copies make each pass several times
// larger and slower to compile.
#if RECO_DEVICE_COMPILER
#define RECO_TOKEN_MATH RECO_HOST_DEVICE inline
#elif (defined(__GNUC__) || defined(__clang__)) && !defined(RECO_NO_FORCE_INLINE)
#define RECO_TOKEN_MATH inline __attribute__((always_inline))
#else
#define RECO_TOKEN_MATH inline
#endif

RECO_NAMESPACE_BEGIN
namespace detail {

template <class V>
struct lanes;  // double below; packs in reco/backend/cpu/simd.hpp

template <>
struct lanes<double> {
  using mask = bool;
  RECO_HOST_DEVICE static double select(bool m, double a, double b) { return m ? a : b; }
  // b < a ? b : a and a < b ? b : a: the comparison and operand order of x86's minpd / maxpd,
  // so that a pack maps each to one instruction (NaN in a gives a).
  RECO_HOST_DEVICE static double min(double a, double b) { return b < a ? b : a; }
  RECO_HOST_DEVICE static double max(double a, double b) { return a < b ? b : a; }
  RECO_HOST_DEVICE static bool any(bool m) { return m; }
  RECO_HOST_DEVICE static double exp(double x) { return ::exp(x); }
  RECO_HOST_DEVICE static double exp_within(double x) { return ::exp(x); }
  RECO_HOST_DEVICE static double expm1(double x) { return ::expm1(x); }
  RECO_HOST_DEVICE static double log(double x) { return ::log(x); }
  // q (1 - q) for q = exp(logq), floored: 1 - q from 1 - exp when q < 1/2 (no cancellation
  // there) and from -expm1 above, so that it is exact as q -> 1. q = 0 and q = 1 give the floor.
  RECO_HOST_DEVICE static double bernoulli_variance(double logq, double floor) {
    const double q = ::exp(logq);
    const double one_minus_q = q < 0.5 ? 1.0 - q : -::expm1(logq);
    const double v = q * one_minus_q;
    return v > floor ? v : floor;
  }
  // expm1(x), into em1, and expm1(x) - x (k3's value).
  RECO_HOST_DEVICE static double expm1_excess(double x, double& em1) {
    em1 = ::expm1(x);
    return em1 - x;
  }
  RECO_HOST_DEVICE static double expm1_excess_within(double x, double& em1) { return expm1_excess(x, em1); }
  static constexpr bool single_precision = false;
};

// Per-token truth values: bool for double, a lane mask for a pack.
template <class V>
using mask_t = typename lanes<V>::mask;

// a where m holds, b elsewhere (both are evaluated).
template <class V>
RECO_TOKEN_MATH V select(const mask_t<V>& m, const V& a, const V& b) {
  return lanes<V>::select(m, a, b);
}
// acc + (m ? x : 0). A lane type may add on m's lanes alone (lanes<V>::add_selected: AVX-512's
// float packs, one merge-masked add instead of a blend and an add); the same value wherever acc
// is not -0, which the per-token sums, started at +0, never are.
template <class V, class = void>
struct has_lane_add_selected : std::false_type {};
template <class V>
struct has_lane_add_selected<V, std::void_t<decltype(lanes<V>::add_selected(std::declval<const mask_t<V>&>(),
                                                                        std::declval<const V&>(), std::declval<const V&>()))>>
    : std::true_type {};
template <class V>
RECO_TOKEN_MATH V add_selected(const mask_t<V>& m, const V& acc, const V& x) {
  if constexpr (has_lane_add_selected<V>::value) return lanes<V>::add_selected(m, acc, x);
  else return acc + select(m, x, V(0.0));
}
template <class V>
RECO_TOKEN_MATH V vexp(const V& x) {
  return lanes<V>::exp(x);
}
// exp(x) where the caller keeps |x| <= 64: the packs skip their range clamp there, with the
// same values; one value is exp itself.
template <class V>
RECO_TOKEN_MATH V vexp_within(const V& x) {
  return lanes<V>::exp_within(x);
}
template <class V>
RECO_TOKEN_MATH V vexpm1(const V& x) {
  return lanes<V>::expm1(x);
}
template <class V>
RECO_TOKEN_MATH V vlog(const V& x) {
  return lanes<V>::log(x);
}

template <class V>
RECO_TOKEN_MATH V mind(const V& a, const V& b) {
  return lanes<V>::min(a, b);
}
template <class V>
RECO_TOKEN_MATH V maxd(const V& a, const V& b) {
  return lanes<V>::max(a, b);
}
// x < lo ? lo : (x > hi ? hi : x), NaN included (lo <= hi).
template <class V>
RECO_TOKEN_MATH V clampd(const V& x, double lo, double hi) {
  return mind(maxd(x, V(lo)), V(hi));
}
// False for NaN and +-inf without relying on <cmath> overloads in device code.
RECO_HOST_DEVICE inline bool finite(double x) { return x - x == 0.0; }
template <class V>
RECO_TOKEN_MATH V sign(const V& x) {
  return select(x > 0, V(1.0), select(x < 0, V(-1.0), V(0.0)));
}
template <class V>
RECO_TOKEN_MATH V sigmoid(const V& x) {
  // exp(-|x|) never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below.
  const V e = vexp(select(x < 0, x, -x));
  return select(x >= 0, V(1.0) / (V(1.0) + e), e / (V(1.0) + e));
}
// The floored Bernoulli variance q (1 - q), q = exp(logq) (see lanes<double>; a pack gets exp
// and expm1 from one range reduction).
template <class V>
RECO_TOKEN_MATH V bernoulli_variance(const V& logq, double floor) {
  return lanes<V>::bernoulli_variance(logq, floor);
}
// expm1(x) into em1 and expm1(x) - x returned: where a lane type computes in float, without
// the cancellation of the difference for small x (reco/backend/cpu/simd.hpp).
template <class V>
RECO_TOKEN_MATH V vexpm1_excess(const V& x, V& em1) {
  return lanes<V>::expm1_excess(x, em1);
}
// The same where the caller keeps |x| <= 64: the float packs skip their range clamp there, with
// the same values.
template <class V>
RECO_TOKEN_MATH V vexpm1_excess_within(const V& x, V& em1) {
  return lanes<V>::expm1_excess_within(x, em1);
}
// Whether V computes in float (the token pass of float inputs; docs/conventions.md, "Precision").
template <class V>
inline constexpr bool single_precision_v = lanes<V>::single_precision;
// 1 - exp(logq), relative-accurate for every q: 1 - q below q = 1/2, -expm1 above.
template <class V>
RECO_TOKEN_MATH V one_minus_exp(const V& logq, const V& q) {
  return select(q < V(0.5), V(1.0) - q, -vexpm1(logq));
}
// A value is "inside a clamp" when the clamp does not bite: its derivative passes through.
template <class V>
RECO_TOKEN_MATH mask_t<V> inside(const V& x, double lo, double hi) {
  return x >= lo && x <= hi;
}

}  // namespace detail
RECO_NAMESPACE_END
