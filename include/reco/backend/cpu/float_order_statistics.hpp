// Order statistics of the valid entries of a float array, in place of filling a key per token and
// selecting among the keys: a radix selection on the floats' ordered bits, two passes over the
// values (the high 16 bits' histogram, then the low 16 bits' of the entries in the wanted high
// bucket), no scratch beyond the histograms and a block of keys. The value is exact, as any
// selection's. Used by the 80/20 rule's cut on reco::cpu (reco/algorithm/select_tokens.hpp).
//
// Each pass works a block of values at a time: the keys (or the matches) of the block first, in a
// branch-free loop that simd::run_widest vectorises for the widest instruction set, then the
// histogram's scalar increments. Computing the key inside the increment loop keeps it scalar,
// and compiled for the baseline it took 2 ns per value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// The float's bits as an unsigned key in the floats' order (-0 taken as +0, so that equal floats
// have equal keys; NaN is not an input here: entropies are checked finite first).
inline std::uint32_t ordered_key(float x) {
  x += 0.0f;
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
inline float from_ordered_key(std::uint32_t k) {
  const std::uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Values per block of a pass: the block's keys stay in L1.
inline constexpr index_t radix_block = 2048;

// Pass 1's block: bucket[t] = the high 16 bits of value t's key, or `buckets` (a slot not counted)
// for a masked token.
struct radix_high_keys {
  template <int W>
  static void run(const float* const& values, const std::uint8_t* const& mask, const index_t& n,
                  std::uint32_t* const& bucket) {
    constexpr std::uint32_t none = 1u << 16;
    if (mask == nullptr) {
      for (index_t t = 0; t < n; ++t) bucket[t] = ordered_key(values[t]) >> 16;
    } else {
      for (index_t t = 0; t < n; ++t) {
        const std::uint32_t b = ordered_key(values[t]) >> 16;
        bucket[t] = mask[t] != 0 ? b : none;
      }
    }
  }
};
// Pass 2's block: slot[t] = the low 16 bits of value t's key when it is valid and in high bucket
// h, else `buckets` (most tokens: the wanted bucket holds a small share of the values).
struct radix_low_keys {
  template <int W>
  static void run(const float* const& values, const std::uint8_t* const& mask, const index_t& n,
                  const std::uint32_t& h, std::uint32_t* const& slot) {
    constexpr std::uint32_t none = 1u << 16;
    if (mask == nullptr) {
      for (index_t t = 0; t < n; ++t) {
        const std::uint32_t k = ordered_key(values[t]);
        slot[t] = (k >> 16) == h ? (k & 0xffffu) : none;
      }
    } else {
      for (index_t t = 0; t < n; ++t) {
        const std::uint32_t k = ordered_key(values[t]);
        slot[t] = (((k >> 16) == h) & (mask[t] != 0)) ? (k & 0xffffu) : none;
      }
    }
  }
};
// The histogram of `Keys`'s slots (0 .. buckets) over [0, n), slot `buckets` left at 0 where
// Skip (a low pass: most tokens fall there, and one counter taking them all would make every
// increment wait on the last): parts of the values counted by `for_each` (a backend's parallel loop) into histograms
// of their own, then added in part order (exact counts: the same whatever runs the parts).
template <class Keys, bool Skip, class ForEach, class... A>
void radix_histogram(const float* values, const std::uint8_t* mask, index_t n, int parts, ForEach&& for_each,
                     std::vector<std::uint32_t>& part_counts, std::vector<index_t>& out, const A&... a) {
  constexpr int buckets = 1 << 16;
  constexpr std::size_t slots = buckets + 1;
  part_counts.assign(static_cast<std::size_t>(parts) * slots, 0);
  const index_t blocks = (n + radix_block - 1) / radix_block;
  const index_t per_part = (blocks + parts - 1) / parts;
  std::uint32_t* const counts = part_counts.data();
  for_each(static_cast<index_t>(parts), [=](index_t p) {
    std::uint32_t bucket[radix_block];
    std::uint32_t* const h = counts + static_cast<std::size_t>(p) * slots;
    const index_t end = std::min(n, (p + 1) * per_part * radix_block);
    for (index_t t0 = p * per_part * radix_block; t0 < end; t0 += radix_block) {
      const index_t len = std::min(radix_block, end - t0);
      const float* v = values + t0;
      const std::uint8_t* mk = mask ? mask + t0 : nullptr;
      std::uint32_t* bk = bucket;
      simd::run_widest_loops<Keys>(v, mk, len, a..., bk);
      if constexpr (Skip) {
        for (index_t t = 0; t < len; ++t)
          if (bucket[t] != buckets) ++h[bucket[t]];  // rarely taken: a predictable branch
      } else {
        for (index_t t = 0; t < len; ++t) ++h[bucket[t]];
      }
    }
  });
  out.assign(slots, 0);
  for (int p = 0; p < parts; ++p)
    for (std::size_t k = 0; k < slots; ++k) out[k] += counts[static_cast<std::size_t>(p) * slots + k];
}

// A sequential for_each.
struct serial_for_each {
  template <class F>
  void operator()(index_t n, F f) const {
    for (index_t i = 0; i < n; ++i) f(i);
  }
};

// out[j] = the ranks[j]-th smallest of values[t] over the tokens t < n with mask[t] != 0 (mask may
// be null: every token), as a double; masked tokens count as +inf, as the generic path's keys
// (HUGE_VAL for a rank among them), and a rank outside [0, n) gives 0. m <= 2.
// counts (may be null): the valid tokens above out[0] and equal to it, which the histograms hold
// already (keys order the floats exactly, -0 equal to +0): 0 and 0 where out[0] is not a valid
// token's value. The passes over the values run in `parts` parts through `for_each` (a
// backend's parallel loop; a part counts at most 2^32 - 1 values).
template <class ForEach = serial_for_each>
void masked_float_order_statistics(const float* values, const std::uint8_t* mask, index_t n, const index_t* ranks,
                                   int m, double* out, double* counts = nullptr, int parts = 1,
                                   ForEach&& for_each = {}) {
  if (counts) counts[0] = counts[1] = 0;
  constexpr int buckets = 1 << 16;
  std::vector<std::uint32_t> part_counts;
  std::vector<index_t> high;  // the last slot takes the masked tokens
  radix_histogram<radix_high_keys, false>(values, mask, n, parts, for_each, part_counts, high);
  const index_t valid = n - high[buckets];
  // Per rank in [0, valid): its high bucket and its rank inside it; a bucket's low histogram is
  // counted once for the ranks it holds (the quantile rule's two ranks are usually neighbours).
  std::vector<index_t> low;
  std::uint32_t counted = 0;
  bool have_low = false;
  for (int j = 0; j < m; ++j) {
    const index_t r = ranks[j];
    if (r < 0 || r >= n) {
      out[j] = 0;
      continue;
    }
    if (r >= valid) {
      out[j] = HUGE_VAL;
      continue;
    }
    index_t below = 0;
    std::uint32_t h = 0;
    while (below + high[h] <= r) below += high[h++];
    if (!have_low || counted != h) {
      radix_histogram<radix_low_keys, true>(values, mask, n, parts, for_each, part_counts, low, h);
      counted = h;
      have_low = true;
    }
    std::uint32_t l = 0;
    while (below + low[l] <= r) below += low[l++];
    out[j] = static_cast<double>(from_ordered_key((h << 16) | l));
    if (j == 0 && counts) {
      counts[0] = static_cast<double>(valid - below - low[l]);
      counts[1] = static_cast<double>(low[l]);
    }
  }
}

}  // namespace detail
RECO_NAMESPACE_END
