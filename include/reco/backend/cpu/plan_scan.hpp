// The step plan's passes over one part's tokens: host code on the CPU's packs, whatever backend
// the calls run on (the plan is built on the host):
//   plan_scan_fn       per response, the valid-token count and (when the response weighter reads
//                      it) the mean old log-probability, checking the values it reads;
//   first_digit_histogram  counts of the valid tokens' entropy keys by their top 16 bits;
//   gather_candidates  per response, the valid tokens above a range of key prefixes, and the
//                      tokens inside it (the later selection rounds and the cut counts read those);
//   sample_first_digits, gather_window  the windowed stage 0: a sample's first digits, then one
//                      read of the tokens for the candidates of a window, the valid counts and the
//                      entropies' check;
//   count_cut          per response, the valid tokens above and on an entropy cut.
// The plan reads only what it needs (the mask, old_logp for a ReCo-style weight, the entropies of
// a selection) so that it costs a small fraction of the call it serves. The call checks every
// input it reads again, so a bad value the plan does not read is still an error, on its rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/backend/cpu/packed_scan.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

// The histogram and cut passes go through simd::run_widest where the SIMD kernels exist (their
// loops then vectorise on the widest registers), and are plain inline functions elsewhere (nvcc).
#if RECO_SIMD
#define RECO_PLAN_PASS RECO_SIMD_INLINE
#else
#define RECO_PLAN_PASS inline
#endif

RECO_NAMESPACE_BEGIN
namespace detail {

// What the plan reads of the per-token inputs.
struct plan_reads {
  bool old_mean = false;  // average old_logp per response (logp when old_logp is not given)
  bool entropy = false;   // check the entropies the selection rounds read
};

#if RECO_SIMD
template <class T>
struct packed_plan_scan;
#endif

template <class T>
struct plan_scan_fn {
  batch_pointers<T> b;
  plan_reads reads;

  // The values averaged for the old mean, and how they are checked (rollout_logp, when the weight
  // reads it, was checked on the host before the scan; old_logp is then checked by the call).
  const T* old_source() const { return b.rollout_logp ? b.rollout_logp : (b.old_logp ? b.old_logp : b.logp); }
  token_checks checks() const {
    return token_checks{reads.old_mean && b.old_logp != nullptr && b.rollout_logp == nullptr, false, reads.entropy,
                        false};
  }
  bool logp_is_old() const { return reads.old_mean && b.old_logp == nullptr && b.rollout_logp == nullptr; }

  token_scan operator()(index_t i) const {
    token_scan s;
#if RECO_SIMD
    const index_t begin = b.layout.begin(i), end = b.layout.end(i);
    simd::run_widest<packed_plan_scan<T>>(*this, begin, end, s);
#else
    token_faults<double> f;
    const token_checks which = checks();
    const T* old = old_source();
    for (index_t t = b.layout.begin(i); t < b.layout.end(i); ++t) {
      if (!b.valid(t)) continue;
      ++s.n;
      const double o = reads.old_mean ? static_cast<double>(old[t]) : 0.0;
      s.old_sum += o;
      // logp is checked only where it stands in for old_logp (a valid value otherwise).
      token_value_checks(f, which, true, logp_is_old() ? o : -1.0, o, 0.0,
                         reads.entropy ? static_cast<double>(b.entropy[t]) : 0.0, 0.0);
    }
    s.status |= fault_status(f);
#endif
    return s;
  }
};

#if RECO_SIMD
// The same on packs of W tokens, laid out as the call's packed scan (from the first valid token,
// per-lane sums) so that the mean rounds as the call's does.
template <class T>
struct packed_plan_scan {
  template <int W>
  static RECO_SIMD_INLINE void run(const plan_scan_fn<T>& f, const index_t& begin, const index_t& end,
                                   token_scan& s) {
    const batch_pointers<T>& b = f.b;
    if (!f.reads.old_mean && !f.reads.entropy) {  // the valid tokens only: count the mask
      if (!b.mask) {
        s.n = end - begin;
        return;
      }
      std::uint32_t n = 0;  // 2^32 tokens of one response would be 16 GiB of logp
      for (index_t t = begin; t < end; ++t) n += b.mask[t] != 0;
      s.n = n;
      return;
    }
    if (!trim_to_valid(b.mask, begin, end, s)) return;
    scan_lanes<W> st;
    index_t t = s.first;
    for (; t + W <= s.last + 1; t += W) step<W, true>(f, t, W, st);
    if (t <= s.last) step<W, false>(f, t, static_cast<int>(s.last + 1 - t), st);
    st.finish(s);
  }

  template <int W, bool Full>
  static RECO_SIMD_INLINE simd::pack<W> load(const T* src, int n) {
    return packed_scan<T>::template load<W, Full>(src, n);
  }

  template <int W, bool Full>
  static RECO_SIMD_INLINE void step(const plan_scan_fn<T>& f, index_t t, int n, scan_lanes<W>& st) {
    using P = simd::pack<W>;
    using M = simd::mask<W>;
    const batch_pointers<T>& b = f.b;
    const M valid = simd::valid_lanes<W, Full>(b.mask ? b.mask + t : nullptr, n);
    const P o = f.reads.old_mean ? load<W, Full>(f.old_source() + t, n) : P(0.0);
    const P h = f.reads.entropy ? load<W, Full>(b.entropy + t, n) : P(0.0);
    st.old_sum += simd::select(valid, o, P(0.0));
    token_value_checks(st.faults, f.checks(), valid, f.logp_is_old() ? o : P(-1.0), o, P(0.0), h, P(0.0));
    st.n.add(valid);
  }
};
#endif

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

// The first selection round: counts of the valid tokens' entropy keys by their top 16 bits, and
// whether a valid entropy is NaN or infinite (the plan's scan leaves the entropies to this pass;
// the least and greatest valid keys tell, as NaN and +-inf lie beyond every finite key).
//
// The tokens go response by response, in chunks whose keys are computed on packs, a masked
// token's key set to 0 (digit 0 holds only negative NaNs, never a count the selection reads); the
// same pass counts each response's valid tokens (the summaries' counts, when the plan reads
// nothing else of the tokens). The keys of ~1024 tokens are then
// counted into 4 interleaved histograms (entropies cluster in few digits, and increments of the
// same counter back to back would wait on each other; the histograms lie 64 bytes more than 2^16
// counters apart, since addresses 4 KiB apart look alike to the store-to-load forwarding and
// stalled it: 1.5x slower on Zen 3). The histograms are kept per thread and all
// zero between calls: a call clears only digit 0 and the digits its valid keys reached ([lo, hi],
// tracked on the packs), so its fixed cost is that range, not the 2^16 digits. Chunks of 64
// masked tokens (a padded layout's tails) are skipped: no keys, no counts.
inline constexpr std::size_t digit_lane_stride = key_digits + 16;

// Tokens go in chunks of this many; a chunk whose mask is all zero is skipped by the passes.
inline constexpr index_t mask_chunk = 64;

// Whether none of the n <= mask_chunk mask bytes at m is set (8 bytes at a time).
inline bool chunk_masked(const std::uint8_t* m, index_t n) {
  std::uint64_t any = 0;
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    std::uint64_t w;
    std::memcpy(&w, m + j, 8);
    any |= w;
  }
  for (; j < n; ++j) any |= m[j];
  return any == 0;
}

// n <= mask_chunk flags of 0 or 1 at in, as the bits of one word (flag j to bit j).
inline std::uint64_t flag_bits(const std::uint8_t* in, index_t n) {
  std::uint64_t bits = 0;
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    std::uint64_t w;
    std::memcpy(&w, in + j, 8);
    bits |= ((w * 0x0102040810204080ull) >> 56) << j;  // byte k's 0/1 to bit k
  }
  for (; j < n; ++j) bits |= static_cast<std::uint64_t>(in[j]) << j;
  return bits;
}

// Asks for the mask_chunk entropies of T at address h and, when m is not 0, the mask line at m
// (addresses as integers: past the end they are only prefetched, never read).
template <class T>
inline void prefetch_chunk_lines(std::uintptr_t h, std::uintptr_t m) {
#if defined(__GNUC__)
  constexpr std::uintptr_t line = 64;
  for (std::uintptr_t x = h; x < h + sizeof(T) * mask_chunk; x += line) __builtin_prefetch(reinterpret_cast<const void*>(x));
  if (m) __builtin_prefetch(reinterpret_cast<const void*>(m));
#else
  (void)h;
  (void)m;
#endif
}
// Asks for the cache lines of the chunk of mask_chunk tokens that starts 4 KiB after h (its
// entropies) and m (its mask bytes, when given). The passes read each token once, most often from
// memory (the call before them evicted it), and between the chunks they read they skip masked
// chunks and count keys, which the hardware prefetcher does not follow far enough ahead: on cold
// data (512 x 1024 slots, Zen 3 guest) the first-digit pass took 0.92 ms without this and 0.67
// with it (0.42 on cached data). Addresses past the end are computed as integers and only
// prefetched, never read.
template <class T>
inline void prefetch_chunk_ahead(const T* h, const std::uint8_t* m) {
  constexpr std::uintptr_t ahead = 4096;
  prefetch_chunk_lines<T>(reinterpret_cast<std::uintptr_t>(h) + ahead, m ? reinterpret_cast<std::uintptr_t>(m) + ahead : 0);
}
// The same for the chunk `tokens` slots after h and m (the sample's next chunks but some: its
// stride leaves the hardware prefetcher nothing to follow).
template <class T>
inline void prefetch_chunk_at(const T* h, const std::uint8_t* m, index_t tokens) {
  const auto t = static_cast<std::uintptr_t>(tokens);
  prefetch_chunk_lines<T>(reinterpret_cast<std::uintptr_t>(h) + sizeof(T) * t, m ? reinterpret_cast<std::uintptr_t>(m) + t : 0);
}

template <class T, class C>
struct first_digit_pass {
  template <int W>
  static RECO_PLAN_PASS void run(const batch_pointers<T>& b, C* const& lanes, std::uint64_t* const& range,
                                 bool* const& nonfinite, index_t* const& valid_out) {
    using K = key_bits<T>;
    constexpr int shift = static_cast<int>(sizeof(T) * 8) - key_digit_bits;
    constexpr index_t block = 1024;
    const T* h = b.entropy;
    const std::uint8_t* m = b.mask;
    K keys[block + mask_chunk];
    C* sub[4] = {lanes, lanes + digit_lane_stride, lanes + 2 * digit_lane_stride, lanes + 3 * digit_lane_stride};
    K lo = ~K(0), hi = 0;  // the least and greatest valid key
    index_t n = 0;         // keys waiting to be counted
    auto count = [&] {
      index_t j = 0;
      for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; ++l) ++sub[l][keys[j + l] >> shift];
      for (; j < n; ++j) ++sub[0][keys[j] >> shift];
      n = 0;
    };
    for (index_t i = 0; i < b.layout.responses; ++i) {
      std::uint32_t valid = 0;  // 2^32 tokens of one response would be 16 GiB of entropies
      for (index_t t0 = b.layout.begin(i), t1 = b.layout.end(i); t0 < t1; t0 += mask_chunk) {
        const index_t len = t1 - t0 < mask_chunk ? t1 - t0 : mask_chunk;
        K* kc = keys + n;
        prefetch_chunk_ahead(h + t0, m ? m + t0 : nullptr);
        if (m) {
          if (chunk_masked(m + t0, len)) continue;
          for (index_t j = 0; j < len; ++j) {
            const K k = order_key_bits(h[t0 + j]);
            const K take = K(0) - static_cast<K>(m[t0 + j] != 0);  // all ones for a valid token
            kc[j] = k & take;
            lo = std::min(lo, k | ~take);
            hi = std::max(hi, k & take);
            valid += static_cast<std::uint32_t>(take & 1);
          }
        } else {
          for (index_t j = 0; j < len; ++j) {
            const K k = order_key_bits(h[t0 + j]);
            kc[j] = k;
            lo = std::min(lo, k);
            hi = std::max(hi, k);
          }
          valid += static_cast<std::uint32_t>(len);
        }
        n += len;
        if (n > block - mask_chunk) count();
      }
      if (valid_out) valid_out[i] = valid;
    }
    count();
    range[0] = lo >> shift;
    range[1] = hi >> shift;
    // NaN and +-inf have the keys beyond the finite values': the extremes tell.
    constexpr T inf = std::numeric_limits<T>::infinity();
    *nonfinite = hi >= order_key_bits(inf) || lo <= order_key_bits(-inf);
  }
};
// out[d] = the count of digit d and out[key_digits + g] the count of group g (doubles, a histogram
// of digit_histogram_size; out is all zero on entry and only the reached digits and their groups
// are written). `nonfinite`: whether a valid entropy is NaN or infinite. `valid` (optional, one
// per response): the response's valid tokens.
template <class T>
void first_digit_histogram(const batch_pointers<T>& b, double* out, bool* nonfinite, index_t* valid = nullptr) {
  auto count = [&](auto zero) {
    using C = decltype(zero);
    constexpr std::size_t S = digit_lane_stride;
    thread_local std::vector<C> lanes(4 * S, C(0));  // all zero between calls
    std::uint64_t range_store[2] = {1, 0};
    C* l = lanes.data();
    std::uint64_t* range = range_store;
#if RECO_SIMD
    simd::run_widest<first_digit_pass<T, C>>(b, l, range, nonfinite, valid);
#else
    first_digit_pass<T, C>::template run<1>(b, l, range, nonfinite, valid);
#endif
    for (std::size_t k = 0; k < 4; ++k) l[k * S] = C(0);  // the masked tokens' digit
    if (range[0] == 0) range[0] = 1;
    for (std::uint64_t d = range[0]; d <= range[1]; ++d) {
      histogram_add(out, d, static_cast<double>(l[d] + l[d + S] + l[d + 2 * S] + l[d + 3 * S]));
      l[d] = l[d + S] = l[d + 2 * S] = l[d + 3 * S] = C(0);
    }
  };
  if (static_cast<std::uint64_t>(b.layout.tokens) < (std::uint64_t(1) << 32)) count(std::uint32_t{0});
  else count(std::uint64_t{0});
}

// The tokens of a part that a cut inside a range of key prefixes may still split: per response,
// the valid tokens above the range, and every valid token inside it (its key and response). The
// rounds after the first narrow the range and count these instead of the part's data.
struct cut_candidates {
  int done = 0;                      // the bits of the prefixes [lo, hi]
  std::uint64_t lo = 1, hi = 0;      // the range of prefixes (empty: nothing gathered)
  std::vector<std::int64_t> above;   // per response of the part: valid tokens above the range
  std::vector<std::uint64_t> keys;   // the valid tokens inside it
  std::vector<index_t> responses;    // ... and their responses (in the part)

  // Empty, for the prefixes [lo, hi] of `done` bits of a part of R responses.
  void reset(int done_now, std::uint64_t lo_now, std::uint64_t hi_now, index_t R) {
    done = done_now;
    lo = lo_now;
    hi = hi_now;
    above.assign(static_cast<std::size_t>(R), 0);
    keys.clear();
    responses.clear();
  }

  // Drops what falls outside [lo, hi] at `done` bits (done >= this->done; a key has `width` bits),
  // counting what lies above.
  void narrow(int width, int done_now, std::uint64_t lo_now, std::uint64_t hi_now) {
    const int s = width - done_now;
    std::size_t k = 0;
    // Without branches: a window of a windowed stage 0 holds many candidates around the few that
    // stay, and which side of the prefixes each lies on is a coin toss for a branch predictor.
    for (std::size_t c = 0; c < keys.size(); ++c) {
      const std::uint64_t p = keys[c] >> s, key = keys[c];
      const index_t r = responses[c];
      above[static_cast<std::size_t>(r)] += p > hi_now;
      keys[k] = key;
      responses[k] = r;
      k += (p >= lo_now) & (p <= hi_now);
    }
    keys.resize(k);
    responses.resize(k);
    done = done_now;
    lo = lo_now;
    hi = hi_now;
  }
};

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

// Gathers a part's cut candidates for the prefixes [lo, hi] of `done` bits (16 <= done < width).
// Summary: the pass is the part's first read of its entropies (the windowed stage 0 of the plan,
// done = 16): it also counts each response's valid tokens into `valid` (when not null) and sets
// `nonfinite` when a valid entropy is NaN or infinite (else valid entropies are finite: the
// summaries checked them, so comparing values is comparing keys).
template <class T, bool Summary = false>
struct gather_pass {
  template <int W>
  static RECO_PLAN_PASS void run(const batch_pointers<T>& b, const int& done, const std::uint64_t& lo_in,
                                 const std::uint64_t& hi_in, cut_candidates& out, index_t* const& valid,
                                 bool* const& nonfinite) {
    constexpr index_t block = mask_chunk;
    const candidate_bounds<T> r(done, lo_in, hi_in);
    const T from = r.from, up = r.up;
    const T* h = b.entropy;
    const std::uint8_t* m = b.mask;
    std::uint8_t in[block];
    std::uint64_t bad = 0;  // Summary: valid tokens whose entropy is not finite
    for (index_t i = 0; i < b.layout.responses; ++i) {
      std::uint32_t a = 0, n_valid = 0;  // 2^32 tokens of one response would be 16 GiB of entropies
      for (index_t t0 = b.layout.begin(i), t1 = b.layout.end(i); t0 < t1; t0 += block) {
        const index_t n = t1 - t0 < block ? t1 - t0 : block;
        prefetch_chunk_ahead(h + t0, m ? m + t0 : nullptr);
#if RECO_SIMD && defined(__SSE2__)
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          if (n == block) {  // a whole chunk as bit words
            const std::uint64_t ok = m ? mask_word(m + t0) : ~std::uint64_t(0);
            if (!ok) continue;
            const value_words w = chunk_value_words<W, Summary>(h + t0, from, up);
            a += static_cast<std::uint32_t>(__builtin_popcountll(ok & w.up));
            if constexpr (Summary) {
              n_valid += static_cast<std::uint32_t>(__builtin_popcountll(ok));
              bad |= ok & ~w.finite;
            }
            for (std::uint64_t bits = ok & w.from & ~w.up; bits; bits &= bits - 1) {
              out.keys.push_back(order_key_bits(h[t0 + __builtin_ctzll(bits)]));
              out.responses.push_back(i);
            }
            continue;
          }
        }
#endif
        if (m && chunk_masked(m + t0, n)) continue;
        unsigned any = 0;
        for (index_t j = 0; j < n; ++j) {
          const T x = h[t0 + j];
          const std::uint32_t ok = m ? static_cast<std::uint32_t>(m[t0 + j] != 0) : 1u;
          const std::uint32_t above = ok & static_cast<std::uint32_t>(x >= up);
          const std::uint32_t inside = ok & static_cast<std::uint32_t>(x >= from) & (above ^ 1u);
          a += above;
          any |= inside;
          in[j] = static_cast<std::uint8_t>(inside);
          if constexpr (Summary) {
            n_valid += ok;
            bad |= ok & static_cast<std::uint32_t>(!(x >= -std::numeric_limits<T>::max() &&
                                                    x <= std::numeric_limits<T>::max()));
          }
        }
        if (!any) continue;
        // The few tokens inside: the flags as the bits of one word, then its set bits.
        for (std::uint64_t bits = flag_bits(in, n); bits; bits &= bits - 1) {
          out.keys.push_back(order_key_bits(h[t0 + __builtin_ctzll(bits)]));
          out.responses.push_back(i);
        }
      }
      out.above[static_cast<std::size_t>(i)] = a;
      if constexpr (Summary) {
        if (valid) valid[i] = n_valid;
      }
    }
    if constexpr (Summary) *nonfinite = bad != 0;
  }
};
template <bool Summary, class T>
void run_gather(const batch_pointers<T>& b, int done, std::uint64_t lo, std::uint64_t hi, cut_candidates& out,
                index_t* valid, bool* nonfinite) {
  out.reset(done, lo, hi, b.layout.responses);
#if RECO_SIMD
  simd::run_widest<gather_pass<T, Summary>>(b, done, lo, hi, out, valid, nonfinite);
#else
  gather_pass<T, Summary>::template run<1>(b, done, lo, hi, out, valid, nonfinite);
#endif
}
template <class T>
void gather_candidates(const batch_pointers<T>& b, int done, std::uint64_t lo, std::uint64_t hi,
                       cut_candidates& out) {
  run_gather<false>(b, done, lo, hi, out, nullptr, nullptr);
}
// The windowed first read of a part's entropies: its cut candidates for the first digits [lo, hi]
// (done = 16) as gather_candidates, and in the same pass each response's valid tokens (`valid`,
// optional) and whether a valid entropy is NaN or infinite.
template <class T>
void gather_window(const batch_pointers<T>& b, std::uint64_t lo, std::uint64_t hi, cut_candidates& out,
                   index_t* valid, bool* nonfinite) {
  run_gather<true>(b, key_digit_bits, lo, hi, out, valid, nonfinite);
}

// A sample of a part's entropy digits (the window of the plan's windowed stage 0): the valid
// tokens of one chunk of mask_chunk slots in every `stride` (the responses' chunks counted in
// order; a stride prime to a padded row's chunks samples its columns alike) have their first
// digits counted into h, a digit histogram of digit_histogram_size counts, zero on entry.
// Returns the tokens counted; range = the least and greatest digit reached (lo > hi: none).
template <class T>
std::uint32_t sample_first_digits(const batch_pointers<T>& b, index_t stride, std::uint32_t* h,
                                  std::uint64_t range[2]) {
  constexpr int shift = static_cast<int>(sizeof(T) * 8) - key_digit_bits;
  const T* e = b.entropy;
  const std::uint8_t* m = b.mask;
  std::uint32_t n = 0;
  std::uint64_t lo = key_digits, hi = 0;
  index_t skip = 0;  // chunks until the next sampled one
  for (index_t i = 0; i < b.layout.responses; ++i) {
    for (index_t t0 = b.layout.begin(i), t1 = b.layout.end(i); t0 < t1; t0 += mask_chunk) {
      if (skip-- > 0) continue;
      skip = stride - 1;
      prefetch_chunk_at(e + t0, m ? m + t0 : nullptr, 4 * stride * mask_chunk);  // about 4 samples ahead
      for (index_t t = t0, end = t1 - t0 < mask_chunk ? t1 : t0 + mask_chunk; t < end; ++t) {
        if (m && !m[t]) continue;
        const std::uint64_t d = order_key_bits(e[t]) >> shift;
        ++h[d];
        ++h[key_digits + (d >> digit_group_bits)];
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
        ++n;
      }
    }
  }
  range[0] = lo;
  range[1] = hi;
  return n;
}

// Per response i of the part: the valid tokens with entropy above `cut` and equal to it.
template <class T, class V>
struct cut_count_pass {
  template <int W>
  static RECO_PLAN_PASS void run(const batch_pointers<T>& b, const V& cut, std::int64_t* const& above,
                                   std::int64_t* const& on) {
    const T* h = b.entropy;
    const std::uint8_t* m = b.mask;
    for (index_t i = 0; i < b.layout.responses; ++i) {
      std::uint32_t a = 0, e = 0;  // 32-bit counts: 2^32 tokens of one response would be 16 GiB
      const index_t t0 = b.layout.begin(i), t1 = b.layout.end(i);
      if (m) {
        for (index_t t = t0; t < t1; ++t) {
          const V x = static_cast<V>(h[t]);
          const std::uint32_t valid = m[t] != 0;
          a += valid & static_cast<std::uint32_t>(x > cut);
          e += valid & static_cast<std::uint32_t>(x == cut);
        }
      } else {
        for (index_t t = t0; t < t1; ++t) {
          const V x = static_cast<V>(h[t]);
          a += static_cast<std::uint32_t>(x > cut);
          e += static_cast<std::uint32_t>(x == cut);
        }
      }
      above[i] = a;
      on[i] = e;
    }
  }
};
template <class T, class V>
void count_cut_as(const batch_pointers<T>& b, V cut, std::int64_t* above, std::int64_t* on) {
#if RECO_SIMD
  simd::run_widest<cut_count_pass<T, V>>(b, cut, above, on);
#else
  cut_count_pass<T, V>::template run<1>(b, cut, above, on);
#endif
}
template <class T>
void count_cut(const batch_pointers<T>& b, double cut, std::int64_t* above, std::int64_t* on) {
  // A float part compares in float when the cut is a float (a value of the step; an interpolated
  // quantile may not be): the same answers, twice the lanes.
  if constexpr (sizeof(T) == 4) {
    if (static_cast<double>(static_cast<float>(cut)) == cut)
      return count_cut_as<T, float>(b, static_cast<float>(cut), above, on);
  }
  count_cut_as<T, double>(b, cut, above, on);
}

}  // namespace detail
RECO_NAMESPACE_END
