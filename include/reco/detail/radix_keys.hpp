// Radix keys of floating-point values: order-preserving integer keys (a < b iff key(a) < key(b)),
// their 16-bit digits and the digit histograms a radix selection sums. Used by the step plan's cut
// and covariance rounds, its host passes and the LibTorch adapter's passes on tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Order-preserving keys of values of type T, in an unsigned integer of T's width: a < b as
// values iff key(a) < key(b); -0 and +0 share a key (adding +0 turns -0 into +0), and a negative
// value's bits are all flipped, a non-negative one's sign bit only (branch-free: the loops that
// call it vectorise).
template <class T>
using key_bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
template <class T>
inline key_bits<T> order_key_bits(T v) {
  using K = key_bits<T>;
  using S = std::make_signed_t<K>;
  constexpr int top = static_cast<int>(sizeof(T) * 8 - 1);
  v = v + T(0);
  K u;
  std::memcpy(&u, &v, sizeof(u));
  const K flip = static_cast<K>(static_cast<S>(u) >> top) | (K(1) << top);
  return u ^ flip;
}

// The value of a key (inverse of order_key_bits; width = sizeof(T)), as a double.
inline double key_value(std::uint64_t k, std::size_t width) {
  if (width == 8) {
    const std::uint64_t u = (k >> 63) ? (k & ~(std::uint64_t(1) << 63)) : ~k;
    double v;
    std::memcpy(&v, &u, sizeof(v));
    return v;
  }
  const std::uint32_t k32 = static_cast<std::uint32_t>(k);
  const std::uint32_t u = (k32 >> 31) ? (k32 & ~(std::uint32_t(1) << 31)) : ~k32;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return static_cast<double>(v);
}

inline constexpr int key_digit_bits = 16;
inline constexpr std::size_t key_digits = std::size_t(1) << key_digit_bits;
// A histogram of digits, as the plan's summaries carry it: the 2^16 digit counts, then the sums of
// each run of 256 digits, so that whoever looks for a rank reads 256 + 256 counts, not 2^16.
inline constexpr int digit_group_bits = 8;
inline constexpr std::size_t digit_groups = key_digits >> digit_group_bits;
inline constexpr std::size_t digit_histogram_size = key_digits + digit_groups;
// Adds `count` tokens to digit d of such a histogram (the digit and its group).
inline void histogram_add(double* h, std::size_t d, double count) {
  h[d] += count;
  h[key_digits + (d >> digit_group_bits)] += count;
}
// The digit of such a histogram that holds the token of ascending rank `rank` (the group holding
// it, then the digit inside the group); `below` gets the count under that digit. key_digits when
// the histogram holds `rank` tokens or fewer.
template <class C>
std::size_t digit_at_rank(const C* h, double rank, double& below) {
  constexpr std::size_t group = std::size_t(1) << digit_group_bits;
  const C* groups = h + key_digits;
  below = 0;
  std::size_t g = 0;
  for (; g < digit_groups && below + groups[g] <= rank; ++g) below += groups[g];
  if (g == digit_groups) return key_digits;
  std::size_t d = g * group;
  for (const std::size_t end = d + group; d < end; ++d) {
    if (below + h[d] > rank) return d;
    below += h[d];
  }
  return key_digits;
}

// The value v such that key(x) >= k exactly when x >= v, for every finite x of type T: the
// selection's later passes compare values against a range of keys without computing keys.
template <class T>
T key_threshold(key_bits<T> k) {
  using K = key_bits<T>;
  constexpr int top = static_cast<int>(sizeof(T) * 8 - 1);
  const T big = std::numeric_limits<T>::max();
  if (k <= order_key_bits(-big)) return -std::numeric_limits<T>::infinity();
  if (k > order_key_bits(big)) return std::numeric_limits<T>::infinity();
  const K u = (k >> top) ? (k & ~(K(1) << top)) : ~k;  // -0 for the key below +0's: x >= -0 iff x >= +0
  T v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// The key prefixes [lo, hi] of `done` bits as values of T: a valid token is a candidate when
// from <= x < up, above them when x >= up. from = the least value of prefix lo, up = the least
// above prefix hi (inf when hi is the last prefix).
template <class T>
struct candidate_bounds {
  T from, up;
  candidate_bounds(int done, std::uint64_t lo, std::uint64_t hi) {
    using K = key_bits<T>;
    const int shift = static_cast<int>(sizeof(T) * 8) - done;
    from = key_threshold<T>(static_cast<K>(lo << shift));
    up = (hi + 1) >> done ? std::numeric_limits<T>::infinity() : key_threshold<T>(static_cast<K>((hi + 1) << shift));
  }
};

}  // namespace detail
RECO_NAMESPACE_END
