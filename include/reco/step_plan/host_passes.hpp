// The step plan's passes over one part's tokens: host code, whatever backend the calls run on
// (the plan is built on the host), written over a pack width W that simd::run_widest picks (their
// instruction-level parts are the CPU backend's, reco/backend/cpu/plan_packs.hpp):
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
#include "reco/backend/cpu/plan_packs.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/radix_keys.hpp"
#include "reco/detail/token_chunks.hpp"
#include "reco/step_plan/cut_candidates.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// What the plan reads of the per-token inputs.
struct plan_reads {
  bool old_mean = false;  // average old_logp per response (logp when old_logp is not given)
  bool entropy = false;   // check the entropies the selection rounds read
};

template <class T>
struct plan_scan_fn {
  using value_type = T;
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
    simd::run_widest<packed_plan_scan<plan_scan_fn>>(*this, begin, end, s);
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
