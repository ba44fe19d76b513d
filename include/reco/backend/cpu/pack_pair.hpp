// Two packs of one response's tokens as one value type for the per-token math: every operation is
// the same operation on each pack. The token body is one long chain of dependent operations per
// pack (an exponential, a clamp, a second exponential, the gradient), some 250 instructions,
// so the out-of-order window holds little more than one pack and waits on that chain. Computing
// two packs as a pair puts their instructions side by side (each operation, each exponential is
// issued for both packs before the next), and the two chains overlap.
//
// Each lane's arithmetic is the pack's own, so the values are bit for bit those of the packs
// computed one after the other.
#pragma once

#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/math.hpp"

#if RECO_SIMD
RECO_NAMESPACE_BEGIN
namespace simd {

// The truth values of a pair: those of its first pack, those of its second.
template <class M>
struct mask_pair {
  M lo, hi;
  RECO_SIMD_INLINE mask_pair() : lo(false), hi(false) {}
  RECO_SIMD_INLINE mask_pair(bool b) : lo(b), hi(b) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE mask_pair(const M& a, const M& b) : lo(a), hi(b) {}
  friend RECO_SIMD_INLINE mask_pair operator&&(const mask_pair& a, const mask_pair& b) {
    return {a.lo && b.lo, a.hi && b.hi};
  }
  friend RECO_SIMD_INLINE mask_pair operator||(const mask_pair& a, const mask_pair& b) {
    return {a.lo || b.lo, a.hi || b.hi};
  }
  friend RECO_SIMD_INLINE mask_pair operator!(const mask_pair& a) { return {!a.lo, !a.hi}; }
};

template <class P>
struct pack_pair {
  using mask_type = mask_pair<typename P::mask_type>;
  P lo, hi;
  RECO_SIMD_INLINE pack_pair() = default;
  // One broadcast for both packs.
  RECO_SIMD_INLINE pack_pair(double d) : lo(d), hi(lo) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE pack_pair(const P& a, const P& b) : lo(a), hi(b) {}

  friend RECO_SIMD_INLINE pack_pair operator+(const pack_pair& a, const pack_pair& b) { return {a.lo + b.lo, a.hi + b.hi}; }
  friend RECO_SIMD_INLINE pack_pair operator-(const pack_pair& a, const pack_pair& b) { return {a.lo - b.lo, a.hi - b.hi}; }
  friend RECO_SIMD_INLINE pack_pair operator*(const pack_pair& a, const pack_pair& b) { return {a.lo * b.lo, a.hi * b.hi}; }
  friend RECO_SIMD_INLINE pack_pair operator/(const pack_pair& a, const pack_pair& b) { return {a.lo / b.lo, a.hi / b.hi}; }
  friend RECO_SIMD_INLINE pack_pair operator-(const pack_pair& a) { return {-a.lo, -a.hi}; }
  friend RECO_SIMD_INLINE mask_type operator<(const pack_pair& a, const pack_pair& b) { return {a.lo < b.lo, a.hi < b.hi}; }
  friend RECO_SIMD_INLINE mask_type operator>(const pack_pair& a, const pack_pair& b) { return {a.lo > b.lo, a.hi > b.hi}; }
  friend RECO_SIMD_INLINE mask_type operator<=(const pack_pair& a, const pack_pair& b) { return {a.lo <= b.lo, a.hi <= b.hi}; }
  friend RECO_SIMD_INLINE mask_type operator>=(const pack_pair& a, const pack_pair& b) { return {a.lo >= b.lo, a.hi >= b.hi}; }
  friend RECO_SIMD_INLINE mask_type operator==(const pack_pair& a, const pack_pair& b) { return {a.lo == b.lo, a.hi == b.hi}; }
  friend RECO_SIMD_INLINE mask_type operator!=(const pack_pair& a, const pack_pair& b) { return {a.lo != b.lo, a.hi != b.hi}; }
};

}  // namespace simd

namespace detail {

// The per-token math on a pair: each pack's own lanes<P> function, pack by pack.
template <class P>
struct lanes<simd::pack_pair<P>> {
  using pair = simd::pack_pair<P>;
  using mask = typename pair::mask_type;
  using one = lanes<P>;
  static RECO_SIMD_INLINE pair select(const mask& m, const pair& a, const pair& b) {
    return {one::select(m.lo, a.lo, b.lo), one::select(m.hi, a.hi, b.hi)};
  }
  static RECO_SIMD_INLINE pair add_selected(const mask& m, const pair& acc, const pair& x) {
    return {detail::add_selected(m.lo, acc.lo, x.lo), detail::add_selected(m.hi, acc.hi, x.hi)};
  }
  static RECO_SIMD_INLINE pair min(const pair& a, const pair& b) { return {one::min(a.lo, b.lo), one::min(a.hi, b.hi)}; }
  static RECO_SIMD_INLINE pair max(const pair& a, const pair& b) { return {one::max(a.lo, b.lo), one::max(a.hi, b.hi)}; }
  static RECO_SIMD_INLINE bool any(const mask& m) { return one::any(m.lo || m.hi); }
  static RECO_SIMD_INLINE pair exp(const pair& x) { return {one::exp(x.lo), one::exp(x.hi)}; }
  static RECO_SIMD_INLINE pair exp_within(const pair& x) { return {one::exp_within(x.lo), one::exp_within(x.hi)}; }
  static RECO_SIMD_INLINE pair expm1(const pair& x) { return {one::expm1(x.lo), one::expm1(x.hi)}; }
  static RECO_SIMD_INLINE pair log(const pair& x) { return {one::log(x.lo), one::log(x.hi)}; }
  static RECO_SIMD_INLINE pair bernoulli_variance(const pair& logq, double floor) {
    return {one::bernoulli_variance(logq.lo, floor), one::bernoulli_variance(logq.hi, floor)};
  }
  static RECO_SIMD_INLINE pair expm1_excess(const pair& x, pair& em1) {
    return {one::expm1_excess(x.lo, em1.lo), one::expm1_excess(x.hi, em1.hi)};
  }
  static RECO_SIMD_INLINE pair expm1_excess_within(const pair& x, pair& em1) {
    return {one::expm1_excess_within(x.lo, em1.lo), one::expm1_excess_within(x.hi, em1.hi)};
  }
  static constexpr bool single_precision = one::single_precision;
};

}  // namespace detail
RECO_NAMESPACE_END
#endif  // RECO_SIMD
