// Order statistics of the valid entries of a float array, in place of filling a key per token and
// selecting among the keys: a radix selection on the floats' ordered bits, two passes over the
// values (the high 16 bits' histogram, then the low 16 bits' of the entries in the wanted high
// bucket), no scratch beyond the histograms. The value is exact, as any selection's. Used by the
// 80/20 rule's cut on reco::cpu (reco/algorithm/select_tokens.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

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

// out[j] = the ranks[j]-th smallest of values[t] over the tokens t < n with mask[t] != 0 (mask may
// be null: every token), as a double; masked tokens count as +inf, as the generic path's keys
// (HUGE_VAL for a rank among them), and a rank outside [0, n) gives 0. m <= 2.
inline void masked_float_order_statistics(const float* values, const std::uint8_t* mask, index_t n,
                                          const index_t* ranks, int m, double* out) {
  constexpr int buckets = 1 << 16;
  std::vector<index_t> high(buckets, 0);
  index_t valid = 0;
  if (mask == nullptr) {
    for (index_t t = 0; t < n; ++t) ++high[ordered_key(values[t]) >> 16];
    valid = n;
  } else {
    for (index_t t = 0; t < n; ++t) {
      const index_t on = mask[t] != 0;
      high[ordered_key(values[t]) >> 16] += on;
      valid += on;
    }
  }
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
      low.assign(buckets, 0);
      for (index_t t = 0; t < n; ++t) {
        const std::uint32_t k = ordered_key(values[t]);
        if ((k >> 16) == h && (mask == nullptr || mask[t] != 0)) ++low[k & 0xffffu];  // rarely taken
      }
      counted = h;
      have_low = true;
    }
    std::uint32_t l = 0;
    while (below + low[l] <= r) below += low[l++];
    out[j] = static_cast<double>(from_ordered_key((h << 16) | l));
  }
}

}  // namespace detail
RECO_NAMESPACE_END
