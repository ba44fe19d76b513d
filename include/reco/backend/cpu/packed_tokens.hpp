// The CPU backend's token pass on SIMD packs: the generic token pass (token_fn,
// reco/algorithm/token_pass.hpp) on packs of W tokens of one response, calling the same per-token
// body (token_body.hpp) instantiated for a pack. Used for a segment of tokens when every
// component has pack math and the advantages are per response; the scalar loop otherwise.
#pragma once

#include <type_traits>
#include <utility>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

#if RECO_SIMD
RECO_NAMESPACE_BEGIN
namespace detail {

// The token pass on packs of L tokens of one response: the same per-token math (the components'
// functions instantiated for a pack), with every per-token branch a select and the sums kept per
// lane, in double, until the end of the segment. Lanes that hold no valid token (masked, padding,
// past the segment's end) compute on harmless stand-in values and are left out of every sum;
// their gradients are written as 0. The segment is cut at the response's thirds (token-variance
// bins) so that each run adds to one bin. A call without diagnostics (token_fn::diagnostics)
// skips their arithmetic and their sums: a branch per pack on a flag that does not change.
template <class Obj, class T, int W>
struct packed_kernel {
  using io = simd::token_io<T, W>;
  using P = typename io::P;
  using M = typename io::M;
  using D = simd::pack<W>;  // the sums' lanes
  using C = typename P::counter_type;
  static constexpr int L = io::L;
  using context = basic_token_context<P>;

  template <class R, class = void>
  struct ratio_ok : std::false_type {};
  template <class R>
  struct ratio_ok<R, std::enable_if_t<is_selectable_v<R>>> : std::true_type {};  // every alternative has pack math
  template <class R>
  struct ratio_ok<R, std::enable_if_t<!is_selectable_v<R> && R::self_clipped, std::void_t<decltype(std::declval<const R&>().surrogate(
                                                             std::declval<const context&>()))>>>
      : std::is_same<decltype(std::declval<const R&>().surrogate(std::declval<const context&>())),
                     basic_surrogate_value<P>> {};
  template <class R>
  struct ratio_ok<R, std::enable_if_t<!is_selectable_v<R> && !R::self_clipped, std::void_t<decltype(std::declval<const R&>().eval(
                                                              std::declval<const context&>()))>>>
      : std::is_same<decltype(std::declval<const R&>().eval(std::declval<const context&>())), basic_ratio_value<P>> {
  };
  template <class Cl, class = void>
  struct clip_ok : std::false_type {};
  template <class Cl>
  struct clip_ok<Cl, std::void_t<decltype(std::declval<const Cl&>().apply(std::declval<const basic_ratio_value<P>&>(),
                                                                          std::declval<const context&>()))>>
      : std::is_same<decltype(std::declval<const Cl&>().apply(std::declval<const basic_ratio_value<P>&>(),
                                                              std::declval<const context&>())),
                     basic_surrogate_value<P>> {};
  template <class K, class = void>
  struct kl_ok : std::bool_constant<!K::active> {};
  // A selectable term is checked through the fixed term it holds.
  template <class K>
  struct kl_ok<K, std::void_t<decltype(std::declval<const K&>().estimate(std::declval<const P&>(),
                                                                         std::declval<const P&>()))>>
      : std::is_same<decltype(std::declval<const K&>().estimate(std::declval<const P&>(), std::declval<const P&>())),
                     basic_kl_value<P>> {};

  // Components written only for double (a user's own, say) keep the scalar loop.
  static constexpr bool supported =
      ratio_ok<typename Obj::ratio_type>::value &&
      (Obj::ratio_type::self_clipped || clip_ok<typename Obj::clip_type>::value) &&
      kl_ok<std::decay_t<decltype(term_of(std::declval<const typename Obj::kl_type&>()))>>::value;

  // Per-lane partial sums of one segment: the loss parts and the sums of inputs (entropies) in
  // double, added pack by pack; the sums of the diagnostics' per-token terms in the pack's type
  // over at most `block` packs (`part`), then added into their double sums (docs/conventions.md,
  // "Precision"); the ratio's min and max in the pack's type, exact either way.
  static constexpr int block = 8;
  struct lane_sums {
    D policy, kl, entropy;
    D ppo_kl, ratio_sum, entropy_kept, variance;
    struct diagnostic_part {
      P ppo_kl = P(0.0), ratio_sum = P(0.0), variance = P(0.0);
    } part;
    int part_packs = 0;
    P ratio_min = P(huge_value), ratio_max = P(-huge_value);
    C valid, policy_tokens, clipped, dual;
    // The diagnostics' block sums into their double sums.
    RECO_SIMD_INLINE void flush() {
      simd::accumulate(ppo_kl, part.ppo_kl);
      simd::accumulate(ratio_sum, part.ratio_sum);
      simd::accumulate(variance, part.variance);
      part = diagnostic_part{};
      part_packs = 0;
    }
  };

  static RECO_SIMD_INLINE void run(const token_fn<Obj, T>& shared, token_partial& p, index_t i, index_t t0,
                                   index_t t1) {
    // A local copy: the gradient stores cannot alias it, so the parameters and pointers stay in
    // registers instead of being reloaded after every store.
    const token_fn<Obj, T> f = shared;
    const response_values v = f.response(i);
    // No valid token lies outside [first, last] (padding, masked ends): zero gradients there.
    auto clamp = [](index_t x, index_t lo, index_t hi) { return x < lo ? lo : (x > hi ? hi : x); };
    const index_t lo = v.first < 0 ? t1 : clamp(v.first, t0, t1);
    const index_t hi = v.first < 0 ? t1 : clamp(v.last + 1, lo, t1);
    zero_gradients(f, t0, lo);
    zero_gradients(f, hi, t1);
    lane_sums acc;
    const bool diag = f.diagnostics;
    // Runs that each fall in one third of the valid span (the cuts clamped into [lo, hi]).
    const index_t bounds[4] = {lo, clamp(v.cut1, lo, hi), clamp(v.cut2, lo, hi), hi};
    for (int third = 0; third < 3; ++third) {
      const index_t begin = bounds[third], end = bounds[third + 1];
      if (end <= begin) continue;
      const double valid_before = acc.valid.total();
      acc.variance = D(0.0);
      index_t t = begin;
      for (; t + L <= end; t += L) step<true>(f, v, t, L, diag, acc);
      if (t < end) step<false>(f, v, t, static_cast<int>(end - t), diag, acc);
      if (diag) {
        acc.flush();
        p.var_sum[third] += simd::sum_lanes(acc.variance);
        p.var_count[third] += acc.valid.total() - valid_before;
      }
    }

    p.valid += acc.valid.total();
    p.policy_tokens += acc.policy_tokens.total();
    // Float lanes without token weights sum the unscaled surrogate: the response's scale (a
    // double) then multiplies the sum once instead of each term rounded to float.
    p.policy += per_response_scale(f) ? v.policy_scale * simd::sum_lanes(acc.policy) : simd::sum_lanes(acc.policy);
    if (diag) {
      const double clipped = acc.clipped.total();
      p.clipped += clipped;
      if (v.advantage < 0) p.clip_low += clipped;
      if (v.advantage > 0) p.clip_high += clipped;
      p.dual += acc.dual.total();
      p.ppo_kl += simd::sum_lanes(acc.ppo_kl);
      p.ratio_sum += simd::sum_lanes(acc.ratio_sum);
      const double rmin = simd::min_lanes(acc.ratio_min), rmax = simd::max_lanes(acc.ratio_max);
      p.ratio_min = rmin < p.ratio_min ? rmin : p.ratio_min;
      p.ratio_max = rmax > p.ratio_max ? rmax : p.ratio_max;
      p.entropy_kept_sum += simd::sum_lanes(acc.entropy_kept);
    }
    const double entropy = simd::sum_lanes(acc.entropy);
    if (diag) p.entropy_sum += entropy;
    if constexpr (Obj::kl_type::active) {
      if (term_on(f.obj.kl)) {
        const double kl = simd::sum_lanes(acc.kl);
        p.kl += term_of(f.obj.kl).params.beta * v.coef * kl;
        p.kl_sum += kl;
      }
    }
    if constexpr (Obj::entropy_type::active) {
      if (term_on(f.obj.entropy)) p.entropy -= term_of(f.obj.entropy).params.coef * v.coef * entropy;
    }
  }

  static RECO_SIMD_INLINE bool per_response_scale(const token_fn<Obj, T>& f) {
    return single_precision_v<P> && f.b.token_weights == nullptr;
  }

  static void zero_gradients(const token_fn<Obj, T>& f, index_t begin, index_t end) {
    for (index_t t = begin; t < end; ++t) f.grad_logp[t] = T(0);
    if (f.grad_entropy)
      for (index_t t = begin; t < end; ++t) f.grad_entropy[t] = T(0);
  }

  // L tokens from t (Full), or the n < L left at the end of a run.
  template <bool Full>
  static RECO_SIMD_INLINE void step(const token_fn<Obj, T>& f, const response_values& v, index_t t, int n,
                                    bool diag, lane_sums& acc) {
    const batch_pointers<T>& b = f.b;

    const M valid = io::template valid<Full>(b.mask ? b.mask + t : nullptr, n);
    // Stand-ins for what invalid lanes hold (NaN, inf, garbage): -1 is a valid log-probability
    // for every component, so nothing below overflows or traps on them.
    context c;
    c.logp = simd::select(valid, io::template load<Full>(b.logp + t, n), P(-1.0));
    c.old_logp = b.old_logp ? simd::select(valid, io::template load<Full>(b.old_logp + t, n), P(-1.0)) : c.logp;
    c.entropy = b.entropy ? simd::select(valid, io::template load<Full>(b.entropy + t, n), P(0.0)) : P(0.0);
    c.advantage = v.advantage;
    c.sequence_log_ratio = v.sequence_log_ratio;
    c.entropy_quantile = v.entropy_quantile;
    const M policy = f.kept ? valid && io::template flags<Full>(f.kept + t, n) : valid;
    P scale = v.policy_scale;
    if (b.token_weights)
      scale = P(v.policy_scale) * simd::select(policy, io::template load<Full>(b.token_weights + t, n), P(0.0));
    P ref = P(-1.0);
    if constexpr (Obj::kl_type::active) {
      if (term_on(f.obj.kl)) ref = simd::select(valid, io::template load<Full>(b.ref_logp + t, n), P(-1.0));
    }

    const token_terms<P> k = token_body(f.obj, c, valid, policy, ref, scale, v.coef);
    simd::accumulate(acc.policy, per_response_scale(f) ? k.surrogate : k.policy);
    acc.policy_tokens.add(policy);
    if (diag) {
      acc.clipped.add(k.clipped);
      acc.dual.add(k.dual);
      auto& part = acc.part;
      part.ppo_kl += k.ppo_kl;
      part.ratio_sum += simd::select(policy, k.x, P(0.0));
      acc.ratio_min = simd::select(policy && k.x < acc.ratio_min, k.x, acc.ratio_min);
      acc.ratio_max = simd::select(policy && k.x > acc.ratio_max, k.x, acc.ratio_max);
      if (b.entropy) simd::accumulate(acc.entropy_kept, simd::select(policy, c.entropy, P(0.0)));
      part.variance += token_variance(c.logp, valid);
      if (++acc.part_packs == block) acc.flush();
    }
    if constexpr (Obj::kl_type::active) simd::accumulate(acc.kl, k.kl);  // 0 while a selectable term is off
    if (term_on(f.obj.entropy) || f.grad_entropy) io::template store<Full>(f.grad_entropy + t, k.entropy_grad, n);
    if (b.entropy && (diag || term_on(f.obj.entropy))) simd::accumulate(acc.entropy, c.entropy);
    acc.valid.add(valid);
    io::template store<Full>(f.grad_logp + t, k.grad, n);
  }
};

// The packed token pass at the widest width the process runs (simd::run_widest).
template <class Obj, class T>
struct packed_tokens {
  static constexpr bool supported = packed_kernel<Obj, T, simd::width>::supported;
  template <int W>
  static RECO_SIMD_INLINE void run(const token_fn<Obj, T>& f, token_partial& p, const index_t& i, const index_t& t0,
                                   const index_t& t1) {
    packed_kernel<Obj, T, W>::run(f, p, i, t0, t1);
  }
};

// The tokens [t0, t1) of response i, simd::width at a time; the scalar loop for advantages given
// per token (a pack's components read one advantage for all its lanes).
template <class Obj, class T>
struct packed_pass<token_fn<Obj, T>> {
  static constexpr bool available = packed_tokens<Obj, T>::supported;
  static void accumulate_segment(const token_fn<Obj, T>& f, token_partial& p, index_t i, index_t t0, index_t t1) {
    if (f.b.token_advantages == nullptr) simd::run_widest<packed_tokens<Obj, T>>(f, p, i, t0, t1);
    else f.accumulate_range(p, i, t0, t1);
  }
};

}  // namespace detail
RECO_NAMESPACE_END
#endif  // RECO_SIMD
