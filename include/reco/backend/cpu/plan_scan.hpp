// The step plan's passes over one part's tokens: host code on the CPU's packs, whatever backend
// the calls run on (the plan is built on the host):
//   plan_scan_fn       per response, the valid-token count and (when the response weighter reads
//                      it) the mean old log-probability, checking the values it reads;
//   entropy_histogram  counts of the valid tokens' entropy keys by one 16-bit digit;
//   count_cut          per response, the valid tokens above and on an entropy cut.
// The plan reads only what it needs (the mask, old_logp for a ReCo-style weight, the entropies of
// a selection) so that it costs a small fraction of the call it serves. The call checks every
// input it reads again, so a bad value the plan does not read is still an error, on its rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
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
    M valid = Full ? M(true) : simd::first_lanes<W>(n);
    if (b.mask)
      valid = valid && (Full ? simd::load_flags<W>(b.mask + t) : simd::load_first_flags<W>(b.mask + t, n));
    const P o = f.reads.old_mean ? load<W, Full>(f.old_source() + t, n) : P(0.0);
    const P h = f.reads.entropy ? load<W, Full>(b.entropy + t, n) : P(0.0);
    st.old_sum += simd::select(valid, o, P(0.0));
    token_value_checks(st.faults, f.checks(), valid, f.logp_is_old() ? o : P(-1.0), o, P(0.0), h, P(0.0));
    st.n.add(valid);
  }
};
#endif

// Order-preserving keys of values of type T, in an unsigned integer of T's width: a < b as
// values iff key(a) < key(b); -0 and +0 share a key (branch-free: a loop the compiler vectorises).
template <class T>
using key_bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
template <class T>
inline key_bits<T> order_key_bits(T v) {
  using K = key_bits<T>;
  constexpr int top = static_cast<int>(sizeof(T) * 8 - 1);
  K u;
  std::memcpy(&u, &v, sizeof(u));
  if (u == (K(1) << top)) u = 0;  // -0 is +0
  const K flip = (u >> top) ? ~K(0) : (K(1) << top);
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

// counts[d] += the valid tokens whose key has digit d at `shift` and the bits above it equal to
// `prefix` (all tokens when `above` is 0 bits). C is an unsigned counter type wide enough for the
// part's tokens. The first round also checks the entropies (the plan's scan leaves them to it).
//
// The tokens go in blocks: their keys are computed on packs first. The first round counts every
// valid token into 4 interleaved histograms (entropies cluster in few digits, and increments of
// the same counter back to back would wait on each other); later rounds count the few tokens
// under the prefix after a vectorised test of the whole block.
template <class T, class C>
struct histogram_pass {
  template <int W>
  static RECO_PLAN_PASS void run(const batch_pointers<T>& b, const int& shift_in, const int& above,
                                   const std::uint64_t& prefix, C* const& counts, bool* const& nonfinite) {
    using K = key_bits<T>;
    const int shift = shift_in;  // a local: the counters' stores cannot alias it
    constexpr index_t block = 1024;
    constexpr K digit = (K(1) << 16) - 1;
    const index_t N = b.layout.tokens;
    const T* h = b.entropy;
    const std::uint8_t* m = b.mask;
    K keys[block];
    std::uint8_t take[block];
    thread_local std::vector<C> lanes;  // kept per thread: fresh pages each round cost more than the round
    if (above == 0) lanes.assign(3 * (std::size_t(digit) + 1), C(0));
    C* sub[4] = {counts, lanes.data(), lanes.data() + (digit + 1), lanes.data() + 2 * (digit + 1)};
    const int high = shift + 16;  // the bits at and above `high` are the prefix
    unsigned bad = 0;
    for (index_t t0 = 0; t0 < N; t0 += block) {
      const index_t n = N - t0 < block ? N - t0 : block;
      for (index_t j = 0; j < n; ++j) keys[j] = order_key_bits(h[t0 + j]);
      if (above == 0) {
        if (m) for (index_t j = 0; j < n; ++j) take[j] = m[t0 + j] != 0;
        else std::memset(take, 1, sizeof(take));
        if (nonfinite)  // h - h is NaN exactly for NaN and +-inf
          for (index_t j = 0; j < n; ++j) bad |= take[j] & static_cast<unsigned>(!(h[t0 + j] - h[t0 + j] == T(0)));
        index_t j = 0;
        for (; j + 4 <= n; j += 4)
          for (int l = 0; l < 4; ++l) sub[l][(keys[j + l] >> shift) & digit] += take[j + l];
        for (; j < n; ++j) counts[(keys[j] >> shift) & digit] += take[j];
        continue;
      }
      const K p = static_cast<K>(prefix);
      unsigned any = 0;
      if (m) {
        for (index_t j = 0; j < n; ++j) {
          take[j] = static_cast<std::uint8_t>((m[t0 + j] != 0) & ((keys[j] >> high) == p));
          any |= take[j];
        }
      } else {
        for (index_t j = 0; j < n; ++j) {
          take[j] = static_cast<std::uint8_t>((keys[j] >> high) == p);
          any |= take[j];
        }
      }
      if (!any) continue;
      // The few tokens under the prefix, 8 flags at a time.
      index_t j = 0;
      for (; j + 8 <= n; j += 8) {
        std::uint64_t w;
        std::memcpy(&w, take + j, 8);
        while (w) {
          const int l = __builtin_ctzll(w) / 8;
          ++counts[(keys[j + l] >> shift) & digit];
          w &= w - 1;
        }
      }
      for (; j < n; ++j)
        if (take[j]) ++counts[(keys[j] >> shift) & digit];
    }
    if (above == 0)
      for (std::size_t d = 0; d <= digit; ++d) counts[d] += sub[1][d] + sub[2][d] + sub[3][d];
    if (nonfinite) *nonfinite = bad != 0;
  }
};
// The loops above vectorise on the widest registers this process has (simd::run_widest).
// With `nonfinite` (first round only), also whether a valid entropy is NaN or infinite.
template <class T, class C>
void entropy_histogram(const batch_pointers<T>& b, int shift, int above, std::uint64_t prefix, C* counts,
                       bool* nonfinite = nullptr) {
#if RECO_SIMD
  simd::run_widest<histogram_pass<T, C>>(b, shift, above, prefix, counts, nonfinite);
#else
  histogram_pass<T, C>::template run<1>(b, shift, above, prefix, counts, nonfinite);
#endif
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
