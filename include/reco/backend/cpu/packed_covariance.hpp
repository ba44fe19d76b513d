// The CPU backend's packed form of Clip-Cov / KL-Cov's per-response sums
// (reco/algorithm/covariance_tokens.hpp: covariance_sums_fn, lane_sum_fn): the 8 lanes of each
// sum run as 8 / W packs of W doubles, chunks of masked tokens skipped. The same bits as the
// generic lanes (a lane's sum starts at +0, and adding a masked token's +0 changes no bit), so a
// single call (through reco::cpu's for_each) and a step plan's summaries (host_covariance_sums)
// agree whichever form each ran.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/token_chunks.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

#if RECO_SIMD
template <class T>
struct lane_sum_pass {
  // The whole blocks of 8 tokens of [t, e): acc[j] and count[j] of lane j; t moves past them.
  template <int W>
  static RECO_SIMD_INLINE void run(const T* const& x, const std::uint8_t* const& mask, index_t& t, const index_t& e,
                                   double* const& acc, double* const& count) {
    static_assert(sum_lanes % W == 0 && mask_chunk % sum_lanes == 0, "whole lanes in a pack, whole blocks in a chunk");
    constexpr int packs = sum_lanes / W;
    using P = simd::pack<W>;
    P s[packs], c[packs];
    if (mask) {
      // Chunks of masked tokens only (a padded row's tail) are skipped: a lane's sum starts at +0
      // and so never is -0, and adding +0 to it changes no bit.
      for (; t + mask_chunk <= e; t += mask_chunk) {
        prefetch_chunk_ahead(x + t, mask + t);
        if (chunk_masked(mask + t, mask_chunk)) continue;
        for (index_t b = t; b < t + mask_chunk; b += sum_lanes) block<W>(x, mask, b, s, c);
      }
      for (; t + sum_lanes <= e; t += sum_lanes) block<W>(x, mask, t, s, c);
    } else {
      for (; t + sum_lanes <= e; t += sum_lanes)
        for (int p = 0; p < packs; ++p) s[p] += simd::load<W>(x + t + p * W);
    }
    for (int p = 0; p < packs; ++p) {
      simd::store(acc + p * W, s[p]);
      simd::store(count + p * W, c[p]);
    }
  }
  // The 8 masked tokens from b into the lanes (a member function, not a lambda: the dispatched
  // variants must inline every pack function, at every optimisation level).
  template <int W>
  static RECO_SIMD_INLINE void block(const T* x, const std::uint8_t* mask, index_t b, simd::pack<W>* s,
                                     simd::pack<W>* c) {
    using P = simd::pack<W>;
    for (int p = 0; p < sum_lanes / W; ++p) {
      const auto ok = simd::valid_lanes<W, true>(mask + b + p * W, W);
      s[p] += simd::select(ok, simd::load<W>(x + b + p * W), P(0.0));  // read unmasked: no branch
      c[p] += simd::select(ok, P(1.0), P(0.0));
    }
  }
};
// lane_sum_fn on packs.
struct packed_lane_sum_fn {
  template <class T>
  double operator()(const T* x, const std::uint8_t* mask, index_t t0, index_t e, std::uint64_t* valid = nullptr) const {
    double acc[sum_lanes] = {}, count[sum_lanes] = {};
    index_t t = t0;
    simd::run_widest<lane_sum_pass<T>>(x, mask, t, e, acc, count);
    return lane_sum_finish(acc, count, x, mask, t, e, valid);
  }
};

template <class T>
struct packed_pass<covariance_sums_fn<T>> {
  static constexpr bool available = true;
  static void run(const covariance_sums_fn<T>& f, index_t i) { f.out[i] = response_covariance_sums(f.b, i, packed_lane_sum_fn{}); }
};

// The lanes whose subset key lies below `below`: covariance_subset_key in 64-bit integer lanes,
// splitmix64(base ^ (lane + offset)) >> 11 with base = seed bits ^ (response << 32), lane k = k
// and offset the pack's position in its response.
template <int W>
RECO_SIMD_INLINE simd::mask<W> keys_below(const typename simd::vectors<W>::u64& base,
                                          const typename simd::vectors<W>::u64& lane, std::uint64_t offset,
                                          const typename simd::vectors<W>::u64& below) {
  typename simd::vectors<W>::u64 h = base ^ (lane + offset);
  h += 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h = (h ^ (h >> 31)) >> 11;
  return simd::opaque_mask<simd::mask<W>>(h < below);
}

// covariance_block_hits_fn on packs: a block's covariances in double, W at a time (the same
// operations as the generic test), and where keyed the subset keys (keys_below), its hit one
// test of the packs' ored masks.
template <class T>
struct block_hits_pass {
  template <int W>
  static RECO_SIMD_INLINE void run(const covariance_block_hits_fn<T>& f) {
    if (f.keyed) blocks<W, true>(f);
    else blocks<W, false>(f);
  }
  template <int W, bool Keyed>
  static RECO_SIMD_INLINE void blocks(const covariance_block_hits_fn<T>& f) {
    static_assert(covariance_block % W == 0, "whole packs in a block");
    using P = simd::pack<W>;
    typedef typename simd::vectors<W>::u64 U;
    const batch_pointers<T>& b = f.b;
    const P mean_adv(f.m.adv), mean_logp(f.m.logp), lo(f.lo), hi(f.hi);
    const P c = P(f.response_adv) - mean_adv;
    U lane;
    simd::set_lane_indices<W>(lane);
    const U base = U{} + ((f.seed_bits ^ (static_cast<std::uint64_t>(f.response) << 32))), below = U{} + f.key_below;
    index_t t = f.t0, j = 0;
    for (; t + covariance_block <= f.e; t += covariance_block, ++j) {
      // A response at a time is too short a stream for the hardware prefetcher to run ahead.
      __builtin_prefetch(b.logp + t + 1024);
      if (b.token_advantages) __builtin_prefetch(b.token_advantages + t + 1024);
      auto hit = simd::mask<W>(false);
      for (index_t u = t; u < t + covariance_block; u += W) {
        const P x = simd::load<W>(b.logp + u) - mean_logp;
        const P cov = b.token_advantages ? (simd::load<W>(b.token_advantages + u) - mean_adv) * x : c * x;
        auto in = cov > lo && cov <= hi;
        if constexpr (Keyed) in = in && keys_below<W>(base, lane, static_cast<std::uint64_t>(u - f.t0), below);
        hit = hit || in;
      }
      if (j % 64 == 0) f.hits[j / 64] = 0;
      f.hits[j / 64] |= static_cast<std::uint64_t>(simd::any(hit)) << (j % 64);
    }
    f.blocks_from(t, j);  // a last, partial block
  }
};
template <class T>
struct packed_pass<covariance_block_hits_fn<T>> {
  static constexpr bool available = true;
  static void run(const covariance_block_hits_fn<T>& f, index_t) { simd::run_widest<block_hits_pass<T>>(f); }
};

// covariance_response_fn on packs, for advantages per response: one loop over the response computes
// its lane sums (the steps of lane_sum_pass, so the same bits) and, from the same loaded values,
// each block's covariances (the steps of block_hits_pass). Keyed (Clip-Cov), the loop gathers the
// positions of the tokens in the band instead (a few per cent of the tokens), and only those are
// hashed, W at a time, whenever the buffer fills and at the end: each whose key lies below
// key_below marks its block (or is passed on as it is: covariance_block_hits_fn::passed). The same
// hits as hashing every token, for a twentieth of the hashes.
template <class T>
struct response_sums_and_hits_pass {
  // The band's positions in the response (t - t0) not yet hashed: at[0, n).
  struct band_positions {
    static constexpr int capacity = 512;
    std::uint64_t* at;  // capacity + 8 (room for a whole pack past the last)
    int n = 0;
  };
  template <int W>
  static RECO_SIMD_INLINE void run(const covariance_response_fn<T>& f) {
    if (f.test.keyed) loop<W, true>(f);
    else loop<W, false>(f);
  }
  // The loop's inputs, constants and sums (a member function, not a lambda, steps them: the
  // dispatched variants must inline every pack function, at every optimisation level). Its
  // vectors are written and read whole, never a lane by a variable index (which would keep the
  // whole state in memory, the sums' additions waiting on a store and a load each), and the
  // inputs are copied here: the band's stores could alias them in `test`.
  template <int W>
  struct lanes_state {
    static constexpr int packs = sum_lanes / W;
    using P = simd::pack<W>;
    typedef typename simd::vectors<W>::u64 U;
    const T* logp;
    const std::uint8_t* mask;
    index_t t0;
    P mean_logp, lo, hi, c;
    U lane, base, below;
    P s[packs], n[packs];
    RECO_SIMD_INLINE explicit lanes_state(const covariance_block_hits_fn<T>& test)
        : logp(test.b.logp),
          mask(test.b.mask),
          t0(test.t0),
          mean_logp(test.m.logp),
          lo(test.lo),
          hi(test.hi),
          c(P(test.response_adv) - P(test.m.adv)),
          base(U{} + (test.seed_bits ^ (static_cast<std::uint64_t>(test.response) << 32))),
          below(U{} + test.key_below) {
      simd::set_lane_indices<W>(lane);
    }
  };
  // The lane sums of the 8 tokens from u, and where `hit` is given their covariance test (keyed:
  // the positions in the band into `band`).
  template <int W, bool Keyed, class Hit>
  static RECO_SIMD_INLINE void step(lanes_state<W>& st, index_t u, Hit* hit, band_positions& band) {
#if RECO_SIMD_OPAQUE_MASKS
    if constexpr (std::is_same_v<Hit, simd::kmask8>) {
      // The same steps with the lanes' truth values in mask registers.
      using P = simd::pack<W>;
      const std::uint8_t* const mask = st.mask;
      const P x = simd::load<W>(st.logp + u);
      if (mask) {
        const simd::kmask8 ok = simd::k8_flags(mask + u);
        simd::k8_add(st.s[0], x, ok);
        simd::k8_add(st.n[0], P(1.0), ok);
      } else {
        st.s[0] += x;
      }
      if (hit == nullptr) return;
      const simd::kmask8 in = simd::k8_in_band(st.c * (x - st.mean_logp), st.lo, st.hi);
      if constexpr (Keyed) band.n += simd::compress_lanes(st.lane + static_cast<std::uint64_t>(u - st.t0), in, band.at + band.n);
      else *hit = *hit || in;
    } else
#endif
    {
      step_lanes<W, Keyed>(st, u, hit, band);
    }
  }
  template <int W, bool Keyed>
  static RECO_SIMD_INLINE void step_lanes(lanes_state<W>& st, index_t u, simd::mask<W>* hit, band_positions& band) {
    using P = simd::pack<W>;
    const std::uint8_t* const mask = st.mask;
    for (int p = 0; p < lanes_state<W>::packs; ++p) {
      const index_t v = u + p * W;
      const P x = simd::load<W>(st.logp + v);
      if (mask) {
        const auto ok = simd::valid_lanes<W, true>(mask + v, W);
        st.s[p] += simd::select(ok, x, P(0.0));
        st.n[p] += simd::select(ok, P(1.0), P(0.0));
      } else {
        st.s[p] += x;
      }
      if (hit == nullptr) continue;
      const P cov = st.c * (x - st.mean_logp);
      const auto in = cov > st.lo && cov <= st.hi;
      if constexpr (Keyed) {
        band.n += simd::compress_lanes<W>(st.lane + static_cast<std::uint64_t>(v - st.t0), in, band.at + band.n);
      } else {
        *hit = *hit || in;
      }
    }
  }
  // The keys of the gathered positions: each below key_below marks its block in test.hits (whose
  // words the loop has already cleared: the positions lie in blocks it has passed), or where
  // test.passed is given goes there itself if valid (with its logp), in token order.
  template <int W>
  static RECO_SIMD_INLINE void hash_band(const lanes_state<W>& st, const covariance_block_hits_fn<T>& test,
                                         band_positions& band) {
    typedef typename simd::vectors<W>::u64 U;
    for (int k = 0; k < band.n; k += W) {
      U at;
      std::memcpy(&at, band.at + k, sizeof at);
      const U held = U{} + static_cast<std::uint64_t>(band.n - k);
      const auto hit = keys_below<W>(st.base, at, 0, st.below) &&
                       simd::opaque_mask<simd::mask<W>>(st.lane < held);
      if (!simd::any(hit)) continue;
      for (int l = 0; l < W; ++l) {
        if (!hit.v[l]) continue;
        if (test.passed) {
          const index_t u = test.t0 + static_cast<index_t>(at[l]);
          if (test.b.valid(u)) test.passed->push_back({u, test.response, static_cast<double>(test.b.logp[u])});
        } else {
          const std::uint64_t j = at[l] / static_cast<std::uint64_t>(covariance_block);
          test.hits[j / 64] |= std::uint64_t(1) << (j % 64);
        }
      }
    }
    band.n = 0;
  }
  template <int W, bool Keyed>
  static RECO_SIMD_INLINE void loop(const covariance_response_fn<T>& f) {
    static_assert(covariance_block % sum_lanes == 0 && sum_lanes % W == 0, "whole lane blocks in a block");
    const covariance_block_hits_fn<T>& test = f.test;
    const batch_pointers<T>& b = test.b;
    lanes_state<W> st(test);
    const index_t t0 = test.t0, e = test.e;
    std::uint64_t positions[band_positions::capacity + 8];
    band_positions band{positions};
    // The 8 double lanes of AVX-512 test and add with their truth values in mask registers.
    using Hit = std::conditional_t<W == 8 && simd::kmask_registers, simd::kmask8, simd::mask<W>>;
    index_t t = t0, j = 0;
    for (; t + covariance_block <= e; t += covariance_block, ++j) {
      __builtin_prefetch(b.logp + t + 1024);
      if (b.mask && (t & 63) < covariance_block) __builtin_prefetch(b.mask + t + 1024);
      if (Keyed && band.n > band_positions::capacity - covariance_block) hash_band<W>(st, test, band);
      Hit hit{};
      for (index_t u = t; u < t + covariance_block; u += sum_lanes) step<W, Keyed>(st, u, &hit, band);
      if (j % 64 == 0) test.hits[j / 64] = 0;
      if constexpr (!Keyed) test.hits[j / 64] |= static_cast<std::uint64_t>(simd::any(hit)) << (j % 64);
    }
    if constexpr (Keyed) hash_band<W>(st, test, band);
    index_t u = t;  // the lane sums' last whole 8 tokens, then their tail
    for (; u + sum_lanes <= e; u += sum_lanes) step<W, Keyed>(st, u, static_cast<Hit*>(nullptr), band);
    double acc[sum_lanes], count[sum_lanes];
    for (int p = 0; p < lanes_state<W>::packs; ++p) {
      simd::store(acc + p * W, st.s[p]);
      simd::store(count + p * W, st.n[p]);
    }
    std::uint64_t valid = static_cast<std::uint64_t>(e - t0);
    covariance_sums out;
    out.logp = lane_sum_finish(acc, count, b.logp, b.mask, u, e, &valid);
    out.n = static_cast<double>(valid);
    *f.out = out;
    test.blocks_from(t, j);  // a last, partial block
  }
};
template <class T>
struct packed_pass<covariance_response_fn<T>> {
  static constexpr bool available = true;
  static void run(const covariance_response_fn<T>& f, index_t) {
    // (Advantages per token: the generic passes, which read them.)
    if (f.test.b.token_advantages) f(0);
    else simd::run_widest<response_sums_and_hits_pass<T>>(f);
  }
};
#endif

// Response i's sums on the host (the step plan's summaries): on packs where the unit has them.
template <class T>
covariance_sums host_covariance_sums(const batch_pointers<T>& b, index_t i) {
#if RECO_SIMD
  return response_covariance_sums(b, i, packed_lane_sum_fn{});
#else
  return response_covariance_sums(b, i);
#endif
}

}  // namespace detail
RECO_NAMESPACE_END
