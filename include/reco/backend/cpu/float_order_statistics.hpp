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
#include <memory>
#include <vector>

#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/token_chunks.hpp"

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

// A block of the sampled path's pass: in_band[t] = 1 for a valid value in [lo, hi]; below and
// above count the valid values under lo and over hi (a block holds at most radix_block values).
struct band_flags {
  template <int W>
  static void run(const float* const& values, const std::uint8_t* const& mask, const index_t& n, const float& lo,
                  const float& hi, std::uint8_t* const& in_band, index_t& below, index_t& above) {
    // Locals: byte stores through a reference's pointer may alias the references, which the loop
    // would then reload per value instead of vectorising.
    const float* const v = values;
    const std::uint8_t* const valid = mask;
    std::uint8_t* const out = in_band;
    const index_t len = n;
    const float l = lo, h = hi;
    std::int32_t b = 0, a = 0;
    if (valid == nullptr) {
      for (index_t t = 0; t < len; ++t) {
        b += v[t] < l;
        a += v[t] > h;
        out[t] = (v[t] >= l) & (v[t] <= h);
      }
    } else {
      for (index_t t = 0; t < len; ++t) {
        const bool on = valid[t] != 0;
        b += on & (v[t] < l);
        a += on & (v[t] > h);
        out[t] = on & (v[t] >= l) & (v[t] <= h);
      }
    }
    below += b;
    above += a;
  }
};

// The value of a rank that names no valid entry: 0 outside [0, n), +inf among the masked tokens
// (at or past `valid`, as the generic path's keys order them). False for a valid entry's rank.
inline bool rank_without_value(index_t r, index_t n, index_t valid, double& out) {
  if (r < 0 || r >= n) {
    out = 0;
    return true;
  }
  if (r >= valid) {
    out = HUGE_VAL;
    return true;
  }
  return false;
}

// The band pass's block in AVX-512 (16 floats at a time, masks in mask registers): the counts,
// and the values inside the band compressed into `out` (a whole register is stored at out + k, so
// out holds 16 floats of slack past what is gathered). The same counts and values, in the same
// order, as band_flags and the gather of the generic loop.
#if RECO_SIMD && defined(__x86_64__) && (RECO_SIMD_DISPATCH_AVX512 || (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)))
#define RECO_BAND_PASS_AVX512 1
RECO_SIMD_TARGET_AVX512 inline void band_block_avx512(const float* v, const std::uint8_t* mask, index_t n, float lo,
                                                     float hi, float* out, index_t& k, index_t& below,
                                                     index_t& above) {
  const __m512 l = _mm512_set1_ps(lo), h = _mm512_set1_ps(hi);
  index_t b = 0, a = 0, g = k;
  for (index_t t = 0; t < n; t += 16) {
    const __mmask16 lanes = n - t >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - t)) - 1);
    // One thread's stream of demand loads does not fill the memory's bandwidth: the lines 4 KiB
    // ahead are asked for (and the mask's, once per 64 tokens).
    _mm_prefetch(reinterpret_cast<const char*>(v + t + 1024), _MM_HINT_T0);
    if (mask && (t & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(mask + t + 1024), _MM_HINT_T0);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, v + t);
    const __mmask16 valid = mask ? _mm_mask_test_epi8_mask(lanes, _mm_maskz_loadu_epi8(lanes, mask + t),
                                                           _mm_set1_epi8(-1))
                                 : lanes;
    const __mmask16 under = _mm512_mask_cmp_ps_mask(valid, x, l, _CMP_LT_OQ);
    const __mmask16 over = _mm512_mask_cmp_ps_mask(valid, x, h, _CMP_GT_OQ);
    const __mmask16 in = _mm512_mask_cmp_ps_mask(_mm512_mask_cmp_ps_mask(valid, x, l, _CMP_GE_OQ), x, h, _CMP_LE_OQ);
    b += __builtin_popcount(under);
    a += __builtin_popcount(over);
    _mm512_storeu_ps(out + g, _mm512_maskz_compress_ps(in, x));
    g += __builtin_popcount(in);
  }
  below += b;
  above += a;
  k = g;
}
#else
#define RECO_BAND_PASS_AVX512 0
#endif
inline bool band_pass_avx512() {
#if RECO_BAND_PASS_AVX512 && RECO_SIMD_DISPATCH_AVX512
  return simd::dispatch() == simd::level::avx512;
#else
  return RECO_BAND_PASS_AVX512 != 0;
#endif
}

// The values of [begin, end) (valid where mask is given) inside [lo, hi] appended to out[k...],
// those below and above counted, a block at a time; stops after the block that takes k past cap.
inline void gather_band(const float* values, const std::uint8_t* mask, index_t begin, index_t end, float lo, float hi,
                        index_t cap, float* gathered, index_t& k, index_t& below, index_t& above) {
  alignas(64) std::uint8_t in_band[radix_block];
  const bool avx512 = band_pass_avx512();
  (void)avx512;  // (unused where the unit has no AVX-512 form)
  for (index_t t0 = begin; t0 < end && k <= cap; t0 += radix_block) {
    const index_t len = std::min(radix_block, end - t0);
    const float* v = values + t0;
    const std::uint8_t* mk = mask ? mask + t0 : nullptr;
#if RECO_BAND_PASS_AVX512
    if (avx512) {
      band_block_avx512(v, mk, len, lo, hi, gathered, k, below, above);
      continue;
    }
#endif
    std::uint8_t* fl = in_band;
    simd::run_widest_loops<band_flags>(v, mk, len, lo, hi, fl, below, above);
    // Most values lie outside the band: test 8 flags at a time.
    index_t t = 0;
    for (; t + 8 <= len; t += 8) {
      std::uint64_t w;
      std::memcpy(&w, in_band + t, 8);
      while (w != 0) {
        const int j = __builtin_ctzll(w) >> 3;
        gathered[k++] = v[t + j];
        w &= w - 1;
      }
    }
    for (; t < len; ++t) {
      gathered[k] = v[t];
      k += in_band[t];
    }
  }
}

// The sample ranks around the wanted ranks' places, and the band they bound: 5 binomial standard
// deviations of a sample of s values (and q sqrt(s (1 - f)) for an estimated valid share f) each
// side, plus 16. widen() takes a rank at the fraction q of the values.
struct sample_band {
  double first = HUGE_VAL, last = -HUGE_VAL;
  void widen(double q, double s, double f) {
    const double sd = std::sqrt(s * q * (1.0 - q)) + q * std::sqrt(s * (1.0 - f));
    first = std::min(first, q * s - 5.0 * sd - 16.0);
    last = std::max(last, q * s + 5.0 * sd + 16.0);
  }
  // [lo, hi] from the sample (reordered); false if no rank widened it.
  bool bounds(std::vector<float>& sample, float& lo, float& hi) const {
    if (first > last) return false;
    const auto s = static_cast<std::ptrdiff_t>(sample.size());
    lo = -HUGE_VALF;
    hi = HUGE_VALF;
    std::ptrdiff_t placed = 0;
    if (first >= 0) {
      placed = static_cast<std::ptrdiff_t>(first);
      std::nth_element(sample.begin(), sample.begin() + placed, sample.end());
      lo = sample[static_cast<std::size_t>(placed)];
    }
    if (last < static_cast<double>(s - 1)) {
      // Past the first selection's place every value is no smaller: select there alone.
      const auto i = static_cast<std::ptrdiff_t>(last) + 1;
      std::nth_element(sample.begin() + placed, sample.begin() + i, sample.end());
      hi = sample[static_cast<std::size_t>(i)];
    }
    return true;
  }
};

// out[j] = the places[j]-th smallest of `all` (places[j] < 0: left as is). From 2^16 values, the
// same sampled band as the first selection's narrows them first: a sample of 2^13 evenly spaced
// values, one pass that counts those below the band and gathers those in it, and a selection
// among the gathered (the whole set where the band misses a place).
inline void select_places(std::vector<float>& all, const index_t* places, int m, double* out) {
  const auto n = static_cast<index_t>(all.size());
  constexpr index_t narrow_from = index_t(1) << 16, samples = index_t(1) << 13;
  if (n >= narrow_from) {
    std::vector<float> sample(static_cast<std::size_t>(samples));
    for (index_t j = 0; j < samples; ++j)
      sample[static_cast<std::size_t>(j)] = all[static_cast<std::size_t>(sample_position(j, n, samples))];
    sample_band band;
    for (int j = 0; j < m; ++j)
      if (places[j] >= 0) band.widen((static_cast<double>(places[j]) + 0.5) / static_cast<double>(n), samples, 1.0);
    float lo, hi;
    if (band.bounds(sample, lo, hi)) {
      const index_t cap = n / 4;
      std::vector<float> inner(static_cast<std::size_t>(cap + radix_block + 16));
      index_t k = 0, below = 0, above = 0;
      gather_band(all.data(), nullptr, 0, n, lo, hi, cap, inner.data(), k, below, above);
      bool holds = k <= cap;
      for (int j = 0; j < m && holds; ++j) holds = places[j] < 0 || (places[j] >= below && places[j] < below + k);
      if (holds) {
        inner.resize(static_cast<std::size_t>(k));
        const index_t shifted[2] = {m > 0 && places[0] >= 0 ? places[0] - below : -1,
                                    m > 1 && places[1] >= 0 ? places[1] - below : -1};
        select_places(inner, shifted, m, out);
        return;
      }
    }
  }
  // std::nth_element leaves those before a place no greater and those after no smaller, so a
  // second place selects in the side it lies on.
  index_t placed = -1;
  for (int j = 0; j < m; ++j) {
    const index_t i = places[j];
    if (i < 0) continue;
    if (placed < 0) {
      std::nth_element(all.begin(), all.begin() + i, all.end());
    } else if (i > placed) {
      std::nth_element(all.begin() + placed + 1, all.begin() + i, all.end());
    } else if (i < placed) {
      std::nth_element(all.begin(), all.begin() + i, all.begin() + placed);
    }
    if (placed < 0) placed = i;
    out[j] = static_cast<double>(all[static_cast<std::size_t>(i)]);
  }
}

// Below this many values the radix selection runs straight away: a sample would not narrow much.
inline constexpr index_t sampled_selection_from = index_t(1) << 20;
inline constexpr index_t selection_samples = index_t(1) << 16;

// The sampled path of masked_float_order_statistics: the wanted ranks' values estimated from the
// valid values at evenly spaced positions, a band [lo, hi] around them wide enough (5 binomial
// standard deviations of the sample's ranks, plus those of its valid share) that it holds the
// ranks all but rarely, then one pass that counts the valid values below and above the band and
// gathers those in it, and a selection among the gathered values. The pass proves the band: every
// wanted valid rank r lies in it when below <= r < below + band size. Returns false (nothing
// written) where it does not, or where the band would hold more than an eighth of the values
// (many ties, or a sample that misses the data's pattern); the radix selection then runs.
template <class ForEach>
bool sampled_float_order_statistics(const float* values, const std::uint8_t* mask, index_t n, const index_t* ranks,
                                    int m, double* out, double* counts, int parts, ForEach& for_each) {
  const index_t S = std::min(n, selection_samples);
  // The sample in the parts, each a stretch of positions in order, then joined in order: the
  // values of a single pass, read by every thread (each sample is a cache miss).
  std::vector<float> sample(static_cast<std::size_t>(S));
  std::vector<index_t> taken(static_cast<std::size_t>(parts), 0);
  for_each(static_cast<index_t>(parts), [&](index_t p) {
    const index_t j0 = S * p / parts, j1 = S * (p + 1) / parts;
    float* out = sample.data() + j0;
    index_t k = 0;
    constexpr index_t ahead = 32;  // ask for later samples while waiting on this one
    for (index_t j = j0; j < j1; ++j) {
      const index_t t = sample_position(j, n, S);
      if (j + ahead < j1) {
        __builtin_prefetch(values + sample_position(j + ahead, n, S));
        if (mask) __builtin_prefetch(mask + sample_position(j + ahead, n, S));
      }
      // (A NaN, which a call's token pass then reports, is left out: nth_element needs an order.)
      out[k] = values[t];
      k += (mask == nullptr || mask[t] != 0) && values[t] == values[t];
    }
    taken[static_cast<std::size_t>(p)] = k;
  });
  index_t s = 0;
  for (int p = 0; p < parts; ++p) {
    const index_t j0 = S * p / parts, k = taken[static_cast<std::size_t>(p)];
    std::memmove(sample.data() + s, sample.data() + j0, static_cast<std::size_t>(k) * sizeof(float));
    s += k;
  }
  sample.resize(static_cast<std::size_t>(s));
  if (s < S / 8) return false;  // mostly masked: a small sample of the valid values
  const double f = static_cast<double>(s) / static_cast<double>(S);  // the valid share
  const double valid_estimate = f * static_cast<double>(n);
  sample_band sb;
  for (int j = 0; j < m; ++j)
    if (ranks[j] >= 0 && ranks[j] < n)
      sb.widen(std::min(1.0, (static_cast<double>(ranks[j]) + 0.5) / valid_estimate), static_cast<double>(s), f);
  float lo, hi;
  if (!sb.bounds(sample, lo, hi)) return false;  // no rank inside [0, n): the radix path writes the zeros

  // The pass: each part counts and gathers its values into a buffer of its own (at most `cap`).
  const index_t cap = n / 8;
  std::vector<std::unique_ptr<float[]>> band(static_cast<std::size_t>(parts));  // not zeroed: pages never touched stay free
  std::vector<index_t> part_below(static_cast<std::size_t>(parts), 0), part_above(static_cast<std::size_t>(parts), 0);
  std::vector<index_t> part_band(static_cast<std::size_t>(parts), 0);
  const index_t blocks = (n + radix_block - 1) / radix_block;
  const index_t per_part = (blocks + parts - 1) / parts;
  for_each(static_cast<index_t>(parts), [&, lo, hi](index_t p) {
    std::unique_ptr<float[]>& mine = band[static_cast<std::size_t>(p)];
    mine.reset(new float[static_cast<std::size_t>(std::min(cap, per_part * radix_block) + radix_block + 16)]);
    index_t below = 0, above = 0, k = 0;
    const index_t begin = std::min(n, p * per_part * radix_block), end = std::min(n, (p + 1) * per_part * radix_block);
    gather_band(values, mask, begin, end, lo, hi, cap, mine.get(), k, below, above);
    part_below[static_cast<std::size_t>(p)] = below;
    part_above[static_cast<std::size_t>(p)] = above;
    part_band[static_cast<std::size_t>(p)] = k;
  });
  index_t below = 0, above = 0, size = 0;
  for (int p = 0; p < parts; ++p) {
    below += part_below[static_cast<std::size_t>(p)];
    above += part_above[static_cast<std::size_t>(p)];
    size += part_band[static_cast<std::size_t>(p)];
  }
  if (size > cap) return false;
  const index_t valid = below + size + above;
  for (int j = 0; j < m; ++j) {
    const index_t r = ranks[j];
    if (r >= 0 && r < valid && (r < below || r >= below + size)) return false;  // the sample missed
  }
  std::vector<float> all;
  all.reserve(static_cast<std::size_t>(size));
  for (int p = 0; p < parts; ++p) {
    const float* b = band[static_cast<std::size_t>(p)].get();
    all.insert(all.end(), b, b + part_band[static_cast<std::size_t>(p)]);
  }
  // Each rank's value: its place among the gathered values.
  index_t places[2] = {-1, -1};
  for (int j = 0; j < m; ++j)
    if (!rank_without_value(ranks[j], n, valid, out[j])) places[j] = ranks[j] - below;
  select_places(all, places, m, out);
  if (counts) {
    counts[0] = counts[1] = 0;
    if (m > 0 && ranks[0] >= 0 && ranks[0] < valid) {
      const float x = static_cast<float>(out[0]);
      index_t greater = 0, equal = 0;
      for (const float v : all) {
        greater += v > x;
        equal += v == x;
      }
      counts[0] = static_cast<double>(above + greater);
      counts[1] = static_cast<double>(equal);
    }
  }
  return true;
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
                                   ForEach&& for_each = {}, index_t sample_from = sampled_selection_from) {
  if (n >= sample_from && sampled_float_order_statistics(values, mask, n, ranks, m, out, counts, parts, for_each))
    return;
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
    if (rank_without_value(r, n, valid, out[j])) continue;
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
