// The CPU backend's response scan on SIMD packs: pass 1 of the generic algorithm
// (scan_response_fn, reco/algorithm/response_passes.hpp) with its token loop on packs of the
// widest width the CPU runs. The same checks and sums; the old_logp sum is kept per lane, so it
// rounds differently from the scalar loop.
#pragma once

#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

#if RECO_SIMD
RECO_NAMESPACE_BEGIN
namespace detail {

// What the response scan accumulates per lane for inputs of type T at W doubles per register
// (float inputs: packs of 2W floats, checked in float; the old_logp sum widened to double).
template <class T, int W>
struct scan_lanes_of {
  using io = simd::token_io<T, W>;
  token_faults<typename io::P> faults;
  simd::pack<W> old_sum = 0.0;
  typename io::P::counter_type n;
  RECO_SIMD_INLINE void finish(token_scan& s) const {
    s.n = static_cast<index_t>(n.total());
    s.old_sum = simd::sum_lanes(old_sum);
    s.status |= fault_status(faults);
  }
};

// Pass 1's token loop on packs: the same checks and sums, the old_logp sum kept per lane (so it
// rounds differently from the scalar loop), the checks or-ed per lane. Only the span between the
// first and the last valid token is read as packs.
template <class T>
struct packed_scan {
  template <int W>
  using lanes_state = scan_lanes_of<T, W>;

  template <int W>
  static RECO_SIMD_INLINE void run(const scan_response_fn<T>& f, const index_t& begin, const index_t& end,
                                   token_scan& s) {
    if (!trim_to_valid(f.b.mask, begin, end, s)) return;  // no valid token
    if (!f.reads_values()) {  // the mask alone
      s.n = f.b.mask ? static_cast<index_t>(simd::nonzero_bytes<W>(f.b.mask + s.first, s.last + 1 - s.first))
                     : s.last + 1 - s.first;
      return;
    }
    lanes_state<W> st;
    scan_span<W, true>(f, f.per_token_checks(), s.first, s.last, st);
    st.finish(s);
  }

  // The packs of the valid span [first, last] into `st`. The token pass that computes the
  // response weights (token_fn::weighs) sums old_logp with it, to the same bits, without the
  // prefetch (`Prefetch`): that pass's own loads run ahead of these.
  template <int W, bool Prefetch>
  static RECO_SIMD_INLINE void scan_span(const scan_response_fn<T>& f, const token_checks& which, index_t first,
                                         index_t last, lanes_state<W>& st) {
    constexpr int L = simd::token_io<T, W>::L;
    index_t t = first;
    for (; t + L <= last + 1; t += L) step<W, true, Prefetch>(f, which, t, L, st);
    if (t <= last) step<W, false, Prefetch>(f, which, t, static_cast<int>(last + 1 - t), st);
  }

  template <int W, bool Full, bool Prefetch>
  static RECO_SIMD_INLINE void step(const scan_response_fn<T>& f, const token_checks& which, index_t t, int n,
                                    lanes_state<W>& st) {
    using io = simd::token_io<T, W>;
    using P = typename io::P;
    using M = typename io::M;
    const batch_pointers<T>& b = f.b;
    if constexpr (Full && Prefetch) {
      // 4 KiB ahead, as the token pass: the responses are short streams that the hardware
      // prefetcher picks up late.
      constexpr index_t ahead = 1024;
      if (b.old_logp) __builtin_prefetch(b.old_logp + t + ahead);
      if (b.mask && (t & 63) < io::L) __builtin_prefetch(b.mask + t + ahead);  // once per 64 positions
    }
    const M valid = io::template valid<Full>(b.mask ? b.mask + t : nullptr, n);
    // Only what the checks and the sum read is loaded (reco's scan reads old_logp alone): the
    // old log-probabilities are logp's where the batch has none.
    const P lp = which.logp ? io::template load<Full>(b.logp + t, n) : P(-1.0);
    const bool reads_old = which.old_logp || (f.sums_old && !b.rollout_logp);
    const T* const old_src = b.old_logp ? b.old_logp : b.logp;
    const P old = !reads_old ? lp : (old_src == b.logp && which.logp ? lp : io::template load<Full>(old_src + t, n));
    if (f.sums_old)
      simd::accumulate(st.old_sum,
                       simd::select(valid, b.rollout_logp ? io::template load<Full>(b.rollout_logp + t, n) : old, P(0.0)));
    const P ref = which.ref_logp ? io::template load<Full>(b.ref_logp + t, n) : P(0.0);
    const P h = which.entropy ? io::template load<Full>(b.entropy + t, n) : P(0.0);
    const P w = which.token_weights ? io::template load<Full>(b.token_weights + t, n) : P(0.0);
    token_value_checks(st.faults, which, valid, lp, old, ref, h, w);
    st.n.add(valid);
  }
};

template <class T>
struct packed_pass<scan_response_fn<T>> {
  static constexpr bool available = true;
  static void run(const scan_response_fn<T>& f, index_t i) {
    token_scan s;
    const index_t begin = f.b.layout.begin(i), end = f.b.layout.end(i);
    simd::run_widest<packed_scan<T>>(f, begin, end, s);
    f.finish(i, s);
  }
};

}  // namespace detail
RECO_NAMESPACE_END
#endif  // RECO_SIMD
