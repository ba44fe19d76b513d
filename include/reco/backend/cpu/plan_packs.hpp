// The CPU backend's packed forms of the step plan's host passes (reco/step_plan/host_passes.hpp):
// the plan's response scan on SIMD packs, and a chunk of entropies compared with a candidate range
// as bit words (SSE2 / AVX). The passes themselves are written once, over a pack width W that
// simd::run_widest picks; these are the parts that name instructions. RECO_PLAN_PASS marks a pass
// body: forced inline where the dispatched variants must inline it, plain inline elsewhere (nvcc).
#pragma once

#include <cstdint>
#include <limits>

#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/backend/cpu/packed_scan.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/token_chunks.hpp"

RECO_NAMESPACE_BEGIN
#if RECO_SIMD
#define RECO_PLAN_PASS RECO_SIMD_INLINE
#else
#define RECO_PLAN_PASS inline
#endif

namespace detail {

#if RECO_SIMD
// The step plan's response scan (plan_scan_fn, reco/step_plan/host_passes.hpp) on the packs of the
// call's packed scan (packed_scan.hpp: 2W floats for float inputs, checked in float, or W
// doubles; from the first valid token; the old_logp sum per double lane, each pack of floats
// widened as the call's), so that the mean rounds as the call's does.
template <class F>
struct packed_plan_scan {
  using T = typename F::value_type;
  template <int W>
  static RECO_SIMD_INLINE void run(const F& f, const index_t& begin, const index_t& end,
                                   token_scan& s) {
    const batch_pointers<T>& b = f.b;
    if (!f.reads.old_mean && !f.reads.entropy) {  // the valid tokens only: count the mask
      if (!b.mask) {
        s.n = end - begin;
        return;
      }
      s.n = static_cast<index_t>(simd::nonzero_bytes<W>(b.mask + begin, end - begin));
      return;
    }
    if (!trim_to_valid(b.mask, begin, end, s)) return;
    constexpr int L = simd::token_io<T, W>::L;
    scan_lanes_of<T, W> st;
    index_t t = s.first;
    for (; t + L <= s.last + 1; t += L) step<W, true>(f, t, L, st);
    if (t <= s.last) step<W, false>(f, t, static_cast<int>(s.last + 1 - t), st);
    st.finish(s);
  }

  template <int W, bool Full>
  static RECO_SIMD_INLINE void step(const F& f, index_t t, int n, scan_lanes_of<T, W>& st) {
    using io = simd::token_io<T, W>;
    using P = typename io::P;
    using M = typename io::M;
    const batch_pointers<T>& b = f.b;
    if constexpr (Full) {
      // 4 KiB ahead, as the call's scan (packed_scan.hpp).
      // (A line per 64 / sizeof(T) positions, the packs' first positions stepping by L; a mask,
      // not a signed remainder, in this loop of a few instructions per pack.)
      constexpr index_t line = 64 / sizeof(T);
      if (f.reads.old_mean && (t & (line - 1)) < io::L) __builtin_prefetch(f.old_source() + t + 4096 / sizeof(T));
      if (b.mask && (t & 63) < io::L) __builtin_prefetch(b.mask + t + 4096);
    }
    const M valid = io::template valid<Full>(b.mask ? b.mask + t : nullptr, n);
    const P o = f.reads.old_mean ? io::template load<Full>(f.old_source() + t, n) : P(0.0);
    const P h = f.reads.entropy ? io::template load<Full>(b.entropy + t, n) : P(0.0);
    if (f.reads.old_mean) simd::accumulate(st.old_sum, simd::select(valid, o, P(0.0)));
    token_value_checks(st.faults, f.checks(), valid, f.logp_is_old() ? o : P(-1.0), o, P(0.0), h, P(0.0));
    st.n.add(valid);
  }
};
#endif

#if RECO_SIMD && defined(__SSE2__)
// A whole chunk of mask_chunk tokens as bit words (bit j for token j): the valid tokens, then the
// tokens with x >= from and with x >= up. The compares' signs come out by movemask, where the
// auto-vectorised loop widened each mask byte to a 32-bit lane and narrowed the flags back: the
// gather pass over 512 x 1024 float slots on a Zen 3 guest took 0.28 ms by that loop, 0.10 ms
// by AVX words and 0.24 ms by SSE2 words.
static_assert(mask_chunk == 64, "one 64-bit word per chunk");
// Bit j set where mask byte j is nonzero (SSE2: every x86-64).
RECO_SIMD_INLINE std::uint64_t mask_word(const std::uint8_t* m) {
  const __m128i zero = _mm_setzero_si128();
  std::uint64_t none = 0;
  for (int k = 0; k < 4; ++k) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 16 * k));
    none |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)))) << (16 * k);
  }
  return ~none;
}
struct value_words {
  std::uint64_t from = 0, up = 0;  // x >= from, x >= up
  std::uint64_t finite = 0;        // |x| <= max (Finite passes only)
};
template <bool Finite = false, class T>
RECO_SIMD_INLINE value_words value_words_sse2(const T* h, T from, T up) {
  value_words w;
  if constexpr (sizeof(T) == 4) {
    const __m128 f = _mm_set1_ps(from), u = _mm_set1_ps(up);
    const __m128 sign = _mm_set1_ps(-0.0f), big = _mm_set1_ps(std::numeric_limits<float>::max());
    for (int k = 0; k < 16; ++k) {
      const __m128 x = _mm_loadu_ps(h + 4 * k);
      w.from |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(x, f)))) << (4 * k);
      w.up |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(x, u)))) << (4 * k);
      if constexpr (Finite)
        w.finite |= static_cast<std::uint64_t>(static_cast<unsigned>(
                        _mm_movemask_ps(_mm_cmple_ps(_mm_andnot_ps(sign, x), big))))
                    << (4 * k);
    }
  } else {
    const __m128d f = _mm_set1_pd(from), u = _mm_set1_pd(up);
    const __m128d sign = _mm_set1_pd(-0.0), big = _mm_set1_pd(std::numeric_limits<double>::max());
    for (int k = 0; k < 32; ++k) {
      const __m128d x = _mm_loadu_pd(h + 2 * k);
      w.from |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm_movemask_pd(_mm_cmpge_pd(x, f)))) << (2 * k);
      w.up |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm_movemask_pd(_mm_cmpge_pd(x, u)))) << (2 * k);
      if constexpr (Finite)
        w.finite |= static_cast<std::uint64_t>(static_cast<unsigned>(
                        _mm_movemask_pd(_mm_cmple_pd(_mm_andnot_pd(sign, x), big))))
                    << (2 * k);
    }
  }
  return w;
}
// The same on 256-bit registers. Not forced inline: a function of a wider target cannot be
// inlined into generic code, which the pass templates are until a dispatched variant (target
// AVX2 or AVX-512, flatten) inlines them, and this with them.
template <bool Finite = false, class T>
__attribute__((target("avx"))) inline value_words value_words_avx(const T* h, T from, T up) {
  value_words w;
  if constexpr (sizeof(T) == 4) {
    const __m256 f = _mm256_set1_ps(from), u = _mm256_set1_ps(up);
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(std::numeric_limits<float>::max());
    for (int k = 0; k < 8; ++k) {
      const __m256 x = _mm256_loadu_ps(h + 8 * k);
      w.from |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, f, _CMP_GE_OQ)))) << (8 * k);
      w.up |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, u, _CMP_GE_OQ)))) << (8 * k);
      if constexpr (Finite)
        w.finite |= static_cast<std::uint64_t>(static_cast<unsigned>(
                        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, x), big, _CMP_LE_OQ))))
                    << (8 * k);
    }
  } else {
    const __m256d f = _mm256_set1_pd(from), u = _mm256_set1_pd(up);
    const __m256d sign = _mm256_set1_pd(-0.0), big = _mm256_set1_pd(std::numeric_limits<double>::max());
    for (int k = 0; k < 16; ++k) {
      const __m256d x = _mm256_loadu_pd(h + 4 * k);
      w.from |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(x, f, _CMP_GE_OQ)))) << (4 * k);
      w.up |= static_cast<std::uint64_t>(static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(x, u, _CMP_GE_OQ)))) << (4 * k);
      if constexpr (Finite)
        w.finite |= static_cast<std::uint64_t>(static_cast<unsigned>(
                        _mm256_movemask_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, x), big, _CMP_LE_OQ))))
                    << (4 * k);
    }
  }
  return w;
}
// A pass at pack width W may use AVX registers when its code is compiled for AVX or wider: a unit
// built with -mavx and up, or a dispatched variant (a W other than the unit's own width).
#if defined(__AVX__)
template <int W>
inline constexpr bool avx_code = W >= 4;
#else
template <int W>
inline constexpr bool avx_code = W >= 4 && W != simd::width;
#endif
template <int W, bool Finite = false, class T>
RECO_SIMD_INLINE value_words chunk_value_words(const T* h, T from, T up) {
  if constexpr (avx_code<W>) return value_words_avx<Finite>(h, from, up);
  else return value_words_sse2<Finite>(h, from, up);
}
#endif

}  // namespace detail
RECO_NAMESPACE_END
