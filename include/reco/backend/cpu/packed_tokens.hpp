// The CPU backend's token pass on SIMD packs: the generic token pass (token_fn,
// reco/algorithm/token_pass.hpp) on packs of W tokens of one response, calling the same per-token
// body (token_body.hpp) instantiated for a pack. Used for a segment of tokens when every
// component has pack math and the advantages are per response; the scalar loop otherwise.
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/pack_pair.hpp"
#include "reco/backend/cpu/packed_scan.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

#if RECO_SIMD
RECO_NAMESPACE_BEGIN
namespace detail {

// The token pass on packs of L tokens of one response: the same per-token math (the components'
// functions instantiated for a pack), with every per-token branch a select and the sums kept per
// lane, in double, until the end of the segment. Lanes that hold no valid token (masked, padding,
// past the segment's end) compute on harmless stand-in values and are left out of every sum;
// their gradients are written as 0. The token variances add up by thirds of the response (the
// diagnostic's bins). A call without diagnostics (token_fn::diagnostics) skips their arithmetic
// and their sums.
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

  // The sums of one chunk of tokens (reco::cpu's token pass hands a kernel call a whole chunk:
  // the call's setup and the sums across lanes are paid once per chunk, not per response).
  //
  // Float lanes add each pack's terms in float over a block of at most `block` packs (8 terms
  // per lane) of one response; each block then goes into the chunk's double lanes, times its
  // response's scale where the sum needs one (docs/conventions.md, "Precision"). Double lanes add
  // the loss parts straight into per-response lanes summed at the response's end (the bits of
  // every earlier version), and the diagnostics over the same blocks into the chunk's lanes.
  static constexpr int block = 8;
  static constexpr bool float_lanes = !std::is_same_v<P, D>;
  // Two full packs computed as one value (pack_pair.hpp), where one pack's chain of dependent
  // operations would leave the vector units waiting: the 16-float packs of AVX-512.
  using pair = simd::pack_pair<P>;
  using pair_mask = typename pair::mask_type;
  static constexpr bool pairs = float_lanes && L == 16;

  // What the sums take from one pack: the token body's terms, kept in a block's buffer between
  // the two phases of a block (the body of up to `block` packs, then their sums), so that the
  // body's arithmetic and the sums' registers are never live together.
  struct pack_terms {
    P policy, kl, log_ratio, x, variance, entropy;
    M valid, policy_mask, clipped, dual;
  };
  // A block's terms, left unset: keep() writes each term that add() reads (the diagnostics' under
  // the same switch), so the packs' zeroing constructors (some 3 KiB of stores per block of
  // AVX-512 float packs) would only be overwritten.
  union block_terms {
    pack_terms at[block];
    RECO_SIMD_INLINE block_terms() {}
  };

  // The deferred value checks of a chunk: the log-probabilities by their keys, the rare
  // entropies and token weights by masks. The three log-probabilities are keyed whichever of
  // them the pass checks (no branch per pack): the stand-ins of invalid lanes and of absent
  // inputs pass, and an input the scan checks has made the call fail before this pass; the
  // failing stretch is checked again input by input (token_fn::check_range).
  struct value_checks {
    simd::log_probability_keys<P> keys;
    M other = false;
    RECO_SIMD_INLINE void add(const token_checks& which, const M& valid, const P& logp, const P& old_logp,
                              const P& ref, const P& entropy, const P& weight) {
      keys.add(logp);
      keys.add(old_logp);
      keys.add(ref);
      if (which.entropy || which.token_weights) {
        token_checks rest{false, false, which.entropy, which.token_weights, false};
        other = other || token_value_faults(rest, valid, logp, old_logp, ref, entropy, weight);
      }
    }
    // A pair's two packs.
    RECO_SIMD_INLINE void add(const token_checks& which, const pair_mask& valid, const pair& logp,
                              const pair& old_logp, const pair& ref, const pair& entropy, const pair& weight) {
      add(which, valid.lo, logp.lo, old_logp.lo, ref.lo, entropy.lo, weight.lo);
      add(which, valid.hi, logp.hi, old_logp.hi, ref.hi, entropy.hi, weight.hi);
    }
    RECO_SIMD_INLINE bool failed() const { return keys.failed() || simd::any(other); }
  };

  // A block's (float lanes) or a response's (double lanes' loss parts) partial sums.
  struct block_sums {
    P policy = P(0.0), kl = P(0.0);                                           // loss parts
    P ppo_kl = P(0.0), ratio_sum = P(0.0);
    P entropy = P(0.0), entropy_kept = P(0.0);  // float lanes: the entropies (valid, policy tokens)
  };
  struct chunk_sums {
    D policy = D(0.0), kl = D(0.0), kl_sum = D(0.0), entropy = D(0.0), entropy_sum = D(0.0);
    D ppo_kl = D(0.0), ratio_sum = D(0.0), entropy_kept = D(0.0), variance[3] = {D(0.0), D(0.0), D(0.0)};
    P ratio_min = P(huge_value), ratio_max = P(-huge_value);
    C valid, policy_tokens, dual, var_count[3];
  };

  // The token variances of the third the pass is in, added pack by pack since the last cut or
  // block start: a whole pack adds to one register, not to a third chosen per pack; the sum goes
  // into the chunk's lanes at each cut and at the block's end (the same float sums in the same
  // order as per third and block).
  struct third_cursor {
    int third = 0;
    index_t next = 0;  // where the next third begins (past every token in the last)
    P sum = P(0.0);
    C count;
    // The third that position t of response v falls in.
    RECO_SIMD_INLINE third_cursor(const response_values& v, index_t t) { enter(v, t >= v.cut2 ? 2 : (t >= v.cut1 ? 1 : 0)); }
    RECO_SIMD_INLINE void enter(const response_values& v, int k) {
      third = k;
      next = k == 0 ? v.cut1 : (k == 1 ? v.cut2 : std::numeric_limits<index_t>::max());
    }
    RECO_SIMD_INLINE void flush(chunk_sums& cs) {
      simd::accumulate(cs.variance[third], sum);
      cs.var_count[third].add(count);
      sum = P(0.0);
      count = C{};
    }
  };

  // The tokens [t0, t1) of responses i, i + 1, ... Whether the call computes the diagnostics is
  // `Diag`: a compile-time constant for the 16-float packs of AVX-512 code (the loop of a call
  // without them then carries none of their work or registers), a run-time flag with a branch
  // per pack elsewhere (one loop instead of two: each doubles the preset instances' compile time).
  static RECO_SIMD_INLINE void run(const token_fn<Obj, T>& shared, token_partial& p, index_t i, index_t t0,
                                   index_t t1) {
    if constexpr (float_lanes && L == 16) {
      if (shared.diagnostics) run_chunk(shared, p, i, t0, t1, std::true_type{});
      else run_chunk(shared, p, i, t0, t1, std::false_type{});
    } else {
      run_chunk(shared, p, i, t0, t1, shared.diagnostics);
    }
  }

  template <class Diag>
  static RECO_SIMD_INLINE void run_chunk(const token_fn<Obj, T>& shared, token_partial& p, index_t i, index_t t0,
                                         index_t t1, Diag diag) {
    // A local copy: the gradient stores cannot alias it, so the parameters and pointers stay in
    // registers instead of being reloaded after every store. Entropies the call does not read
    // (given for diagnostics it has switched off) are not loaded.
    token_fn<Obj, T> f = shared;
    if (!f.reads_entropy(diag)) f.b.entropy = nullptr;
    const token_layout& layout = f.b.layout;
    chunk_sums cs;
    value_checks checks;
    removed_cursor removed{f.removed_from(t0), f.removed + f.removed_count};
    for (index_t t = t0; t < t1;) {
      while (t >= layout.end(i)) ++i;
      const index_t stop = layout.end(i) < t1 ? layout.end(i) : t1;
      run_response(f, p, cs, checks, removed, diag, i, t, stop);
      t = stop;
    }
    p.valid += cs.valid.total();
    p.policy_tokens += f.selects() ? cs.policy_tokens.total() : cs.valid.total();
    if (f.checks.any() && checks.failed()) p.status |= f.check_range(t0, t1);
    if constexpr (float_lanes) {
      p.policy += simd::sum_lanes(cs.policy);
      p.kl += simd::sum_lanes(cs.kl);
      p.kl_sum += simd::sum_lanes(cs.kl_sum);
      p.entropy += simd::sum_lanes(cs.entropy);
    }
    if (diag) {
      p.dual += cs.dual.total();
      p.ppo_kl += simd::sum_lanes(cs.ppo_kl);
      p.ratio_sum += simd::sum_lanes(cs.ratio_sum);
      const double rmin = simd::min_lanes(cs.ratio_min), rmax = simd::max_lanes(cs.ratio_max);
      p.ratio_min = rmin < p.ratio_min ? rmin : p.ratio_min;
      p.ratio_max = rmax > p.ratio_max ? rmax : p.ratio_max;
      p.entropy_kept_sum += simd::sum_lanes(cs.entropy_kept);
      p.entropy_sum += simd::sum_lanes(cs.entropy_sum);
      for (int k = 0; k < 3; ++k) {
        p.var_sum[k] += simd::sum_lanes(cs.variance[k]);
        p.var_count[k] += cs.var_count[k].total();
      }
    }
  }

  // The removed tokens (token_fn::removed) not yet passed: [next, end).
  struct removed_cursor {
    const index_t* next;
    const index_t* end;
    // The policy lanes of the n tokens from t without the removed ones among them: a branch that
    // is rarely taken (a few removed tokens in a chunk), then a flag per lane.
    RECO_SIMD_INLINE M remove(const M& policy, index_t t, int n) {
      if (next == end || *next >= t + n) return policy;
      std::uint8_t keep[L];
      for (int k = 0; k < L; ++k) keep[k] = 1;
      for (; next != end && *next < t + n; ++next)
        if (*next >= t) keep[*next - t] = 0;
      return policy && io::template flags<true>(keep, L);
    }
  };

  // The tokens [t0, t1) of response i.
  template <class Diag>
  static RECO_SIMD_INLINE void run_response(const token_fn<Obj, T>& f, token_partial& p, chunk_sums& cs,
                                            value_checks& checks, removed_cursor& removed, Diag diag, index_t i,
                                            index_t t0, index_t t1) {
    // Where the pass weighs, w_i multiplies the policy scale below (coef * 1 * w_i: the bits of
    // coef * w_i), once the segment is known to hold a valid token.
    response_values v = f.response(i, f.weighs ? 1.0 : f.r.weight[i]);
    // No valid token lies outside [first, last] (padding, masked ends): zero gradients there.
    auto clamp = [](index_t x, index_t lo, index_t hi) { return x < lo ? lo : (x > hi ? hi : x); };
    const index_t lo = v.first < 0 ? t1 : clamp(v.first, t0, t1);
    const index_t hi = v.first < 0 ? t1 : clamp(v.last + 1, lo, t1);
    zero_gradients(f, t0, lo);
    zero_gradients(f, hi, t1);
    if (hi <= lo) return;
    if (f.weighs) v.policy_scale *= summed_weight(f, v, i, v.first >= t0);
    const bool check = f.checks.any();
    // The response's scale of each loss part's sum.
    const bool scaled = per_response_scale(f);
    double kl_scale = 0, entropy_scale = 0;
    if constexpr (Obj::kl_type::active) {
      if (term_on(f.obj.kl)) kl_scale = term_of(f.obj.kl).params.beta * v.coef;
    }
    if constexpr (Obj::entropy_type::active) {
      if (term_on(f.obj.entropy)) entropy_scale = -term_of(f.obj.entropy).params.coef * v.coef;
    }
    C clipped;  // this response's clipped tokens (low or high by its advantage's sign)
    block_sums rs;  // double lanes: the response's loss parts
    // The response's entropies: float lanes add them over each block, as every other sum, double
    // lanes pack by pack (docs/conventions.md, "Precision").
    D entropy = D(0.0);
    third_cursor thirds(v, lo);
    // Blocks of up to `block` packs: their terms, then their sums.
    for (index_t t = lo; t < hi;) {
      block_terms block_of;
      pack_terms* const terms = block_of.at;
      const index_t first = t;
      int packs = 0;
      if constexpr (pairs) {
        for (; packs + 2 <= block && t + 2 * L <= hi; packs += 2, t += 2 * L)
          body<true, pair>(f, v, t, 2 * L, check, diag, checks, removed, terms + packs);
      } else {
        for (; packs < block && t + L <= hi; ++packs, t += L)
          body<true, P>(f, v, t, L, check, diag, checks, removed, terms + packs);
      }
      // The run's end, a pack at a time: the partial pack, and with pairs a full one before it
      // (through the partial pack's loads: one loop body fewer to compile, for one pack per run).
      for (; packs < block && t < hi; ++packs) {
        const int n = hi - t < L ? static_cast<int>(hi - t) : L;
        body<false, P>(f, v, t, n, check, diag, checks, removed, terms + packs);
        t += n;
      }
      block_sums bs;
      for (int k = 0; k < packs; ++k)
        add(f, terms[k], first + static_cast<index_t>(k) * L, v, diag, float_lanes ? bs : rs, bs, cs, thirds, entropy,
            clipped);
      if constexpr (float_lanes) {
        if (sums_entropy(f, diag)) simd::accumulate(entropy, bs.entropy);
        simd::accumulate_scaled(cs.policy, bs.policy, scaled ? v.policy_scale : 1.0);
        if constexpr (Obj::kl_type::active) {
          simd::accumulate_scaled(cs.kl, bs.kl, kl_scale);
          simd::accumulate(cs.kl_sum, bs.kl);
        }
      }
      if (diag) {
        simd::accumulate(cs.ppo_kl, bs.ppo_kl);
        simd::accumulate(cs.ratio_sum, bs.ratio_sum);
        thirds.flush(cs);
        if (float_lanes && f.b.entropy) simd::accumulate(cs.entropy_kept, bs.entropy_kept);
      }
    }
    if constexpr (float_lanes) {
      if (f.b.entropy) {
        if (diag) cs.entropy_sum += entropy;
        if constexpr (Obj::entropy_type::active) cs.entropy += entropy * D(entropy_scale);
      }
    } else {
      // Double lanes: the loss parts summed per response, as every earlier version did.
      p.policy += simd::sum_lanes(rs.policy);
      const double h = simd::sum_lanes(entropy);
      if (diag) p.entropy_sum += h;
      if constexpr (Obj::kl_type::active) {
        const double kl = simd::sum_lanes(rs.kl);
        p.kl += kl_scale * kl;
        p.kl_sum += kl;
      }
      if constexpr (Obj::entropy_type::active) p.entropy += entropy_scale * h;
    }
    if (diag) {
      const double n = clipped.total();
      p.clipped += n;
      if (v.advantage < 0) p.clip_low += n;
      if (v.advantage > 0) p.clip_high += n;
    }
  }

  // Response i's weight (token_fn::weighs) from its old log-probabilities summed as the response
  // scan sums them: the same packs from its first valid token, so the same bits as a call that
  // weighs before this pass (a planned one). The response's values are then in cache for its
  // tokens' loads.
  static RECO_SIMD_INLINE double summed_weight(const token_fn<Obj, T>& f, const response_values& v, index_t i,
                                               bool owner) {
    const token_checks none{false, false, false, false, false};
    const scan_response_fn<T> sum{f.b, input_checks{}, response_scratch{}, none, true};
    typename packed_scan<T>::template lanes_state<W> st;
    packed_scan<T>::template scan_span<W, false>(sum, none, v.first, v.last, st);
    token_scan s;
    st.finish(s);
    return f.weight_from_sum(i, s.old_sum, owner);
  }

  // Whether the pass sums the entropies: given, and read by the diagnostics or the entropy term.
  template <class Diag>
  static RECO_SIMD_INLINE bool sums_entropy(const token_fn<Obj, T>& f, Diag diag) {
    return f.b.entropy && (diag || term_on(f.obj.entropy));
  }

  static RECO_SIMD_INLINE bool per_response_scale(const token_fn<Obj, T>& f) {
    return single_precision_v<P> && f.b.token_weights == nullptr;
  }

  static void zero_gradients(const token_fn<Obj, T>& f, index_t begin, index_t end) {
    if (end <= begin) return;
    // All bits zero is +0 in float and double.
    std::memset(f.grad_logp + begin, 0, static_cast<std::size_t>(end - begin) * sizeof(T));
    if (f.grad_entropy) std::memset(f.grad_entropy + begin, 0, static_cast<std::size_t>(end - begin) * sizeof(T));
  }

  // Loads and stores of a body's value V: one pack (Full, or the first n lanes), or a pair of
  // full packs from src.
  template <class V>
  static constexpr bool paired = std::is_same_v<V, pair>;
  template <class V, bool Full>
  static RECO_SIMD_INLINE V load(const T* src, int n) {
    if constexpr (paired<V>) return V(io::template load<true>(src, L), io::template load<true>(src + L, L));
    else return io::template load<Full>(src, n);
  }
  template <class V, bool Full>
  static RECO_SIMD_INLINE mask_t<V> flags(const std::uint8_t* src, int n) {
    if constexpr (paired<V>) return {io::template flags<true>(src, L), io::template flags<true>(src + L, L)};
    else return io::template flags<Full>(src, n);
  }
  template <class V, bool Full>
  static RECO_SIMD_INLINE mask_t<V> valid_lanes(const std::uint8_t* mask, int n) {
    if constexpr (paired<V>) {
      return {io::template valid<true>(mask, L), io::template valid<true>(mask ? mask + L : nullptr, L)};
    } else {
      return io::template valid<Full>(mask, n);
    }
  }
  template <class V, bool Full>
  static RECO_SIMD_INLINE void store(T* dst, const V& x, int n) {
    if constexpr (paired<V>) {
      io::template store<true>(dst, x.lo, L);
      io::template store<true>(dst + L, x.hi, L);
    } else {
      io::template store<Full>(dst, x, n);
    }
  }
  // Pack K of a body's value.
  template <int K, class X>
  static RECO_SIMD_INLINE const auto& part(const X& x) {
    if constexpr (std::is_same_v<X, pair> || std::is_same_v<X, pair_mask>) {
      if constexpr (K == 0) return x.lo;
      else return x.hi;
    } else {
      return x;
    }
  }

  // The token body of the n tokens from t: a full pack (n = L), the n < L left at the end of a
  // run, or (V = pair) two full packs (n = 2L). The gradients are written, the deferred value
  // checks added to `checks`, each pack's terms put in r[0] (and r[1]).
  template <bool Full, class V, class Diag>
  static RECO_SIMD_INLINE void body(const token_fn<Obj, T>& f, const response_values& v, index_t t, int n, bool check,
                                    Diag diag, value_checks& checks, removed_cursor& removed, pack_terms* r) {
    using mask = mask_t<V>;
    constexpr int packs = paired<V> ? 2 : 1;
    const batch_pointers<T>& b = f.b;
    if constexpr (Full) {
      // The hardware prefetcher alone leaves the loads of this compute-heavy loop waiting on the
      // last level cache: 4 KiB ahead, a line of each array per pack (of the mask, one in 64 / L).
      // The gradients too, for writing: their lines then arrive before the stores fill the
      // store buffer.
      constexpr index_t ahead = 1024;
      for (int k = 0; k < packs; ++k) {
        const index_t at = t + ahead + k * L;
        __builtin_prefetch(b.logp + at);
        if (b.old_logp) __builtin_prefetch(b.old_logp + at);
        if (Obj::kl_type::active) __builtin_prefetch(b.ref_logp + at);
        __builtin_prefetch(f.grad_logp + at, 1);
        if (f.grad_entropy) __builtin_prefetch(f.grad_entropy + at, 1);
      }
      if ((t & 63) < packs * L && b.mask) __builtin_prefetch(b.mask + t + ahead);  // once per 64 positions
    }
    const mask valid = valid_lanes<V, Full>(b.mask ? b.mask + t : nullptr, n);
    // Stand-ins for what invalid lanes hold (NaN, inf, garbage): -1 is a valid log-probability
    // for every component, so nothing below overflows or traps on them.
    basic_token_context<V> c;
    c.logp = select(valid, load<V, Full>(b.logp + t, n), V(-1.0));
    c.old_logp = b.old_logp ? select(valid, load<V, Full>(b.old_logp + t, n), V(-1.0)) : c.logp;
    c.entropy = b.entropy ? select(valid, load<V, Full>(b.entropy + t, n), V(0.0)) : V(0.0);
    c.advantage = v.advantage;
    c.sequence_log_ratio = v.sequence_log_ratio;
    c.entropy_quantile = v.entropy_quantile;
    mask policy = valid;
    if constexpr (token_fn<Obj, T>::may_keep) {
      if (f.kept) policy = valid && flags<V, Full>(f.kept + t, n);
    }
    if constexpr (token_fn<Obj, T>::may_remove) {
      if constexpr (paired<V>) {
        policy.lo = removed.remove(policy.lo, t, L);
        policy.hi = removed.remove(policy.hi, t + L, L);
      } else {
        policy = removed.remove(policy, t, n);
      }
    }
    V scale = v.policy_scale;
    V weight = V(0.0);
    if (b.token_weights) {
      weight = load<V, Full>(b.token_weights + t, n);
      scale = V(v.policy_scale) * select(policy, weight, V(0.0));
    }
    V ref = V(-1.0);
    if ((Obj::kl_type::active && term_on(f.obj.kl)) || f.checks.ref_logp)
      ref = select(valid, load<V, Full>(b.ref_logp + t, n), V(-1.0));
    // The deferred value checks, on the valid lanes (where the stand-ins are the inputs).
    if (check) checks.add(f.checks, valid, c.logp, c.old_logp, ref, c.entropy, weight);
    if (diag) set_logp_variance(c);  // the diagnostic's, read by ReCo's ratio too

    const token_terms<V> k = token_body(f.obj, c, valid, policy, ref, scale, v.coef);
    if (term_on(f.obj.entropy) || f.grad_entropy) store<V, Full>(f.grad_entropy + t, k.entropy_grad, n);
    store<V, Full>(f.grad_logp + t, k.grad, n);
    keep<0>(f, k, c, valid, policy, scale, diag, r[0]);
    if constexpr (paired<V>) keep<1>(f, k, c, valid, policy, scale, diag, r[1]);
  }
  // Pack K's part of the body's terms.
  template <int K, class V, class Diag>
  static RECO_SIMD_INLINE void keep(const token_fn<Obj, T>& f, const token_terms<V>& k, const basic_token_context<V>& c,
                                    const mask_t<V>& valid, const mask_t<V>& policy, const V& scale, Diag diag,
                                    pack_terms& r) {
    // The surrogate, scaled per block or here (+-0 off the policy lanes, which a sum that never
    // holds -0 adds as +0).
    if (per_response_scale(f)) r.policy = part<K>(k.surrogate);
    else r.policy = part<K>(scale) * part<K>(k.surrogate);
    r.kl = part<K>(k.kl);
    r.valid = part<K>(valid);
    r.policy_mask = part<K>(policy);
    r.entropy = part<K>(c.entropy);
    if (diag) {
      // ppo_kl's sum subtracts the log-ratio on the policy lanes: the bits of adding k.ppo_kl
      // (old_logp - logp is -(logp - old_logp) exactly), the difference the ratio has computed.
      r.log_ratio = part<K>(c.logp) - part<K>(c.old_logp);
      r.x = part<K>(k.x);
      r.clipped = part<K>(k.clipped);
      r.dual = part<K>(k.dual);
      r.variance = part<K>(c.logp_variance);  // the sums mask the invalid lanes
    }
  }

  // One pack's terms (its first token at t) into the sums: the loss parts into `loss` (the block's
  // sums for float lanes, the response's for double lanes), the diagnostics into the block's, the
  // token variance into the third of the response its lanes fall in.
  template <class Diag>
  static RECO_SIMD_INLINE void add(const token_fn<Obj, T>& f, const pack_terms& k, index_t t, const response_values& v,
                                   Diag diag, block_sums& loss, block_sums& bs, chunk_sums& cs, third_cursor& thirds,
                                   D& entropy, C& clipped) {
    const M& policy = k.policy_mask;
    loss.policy += k.policy;
    if (f.selects()) cs.policy_tokens.add(policy);
    if (diag) {
      clipped.add(k.clipped);
      cs.dual.add(k.dual);
      simd::sub_where(policy, bs.ppo_kl, k.log_ratio);
      simd::add_where(policy, bs.ratio_sum, k.x);
      // x < min ? x : min on the policy lanes (a NaN ratio is left out, as by the scalar loop).
      simd::min_where(policy, cs.ratio_min, k.x);
      simd::max_where(policy, cs.ratio_max, k.x);
      if (f.b.entropy) {
        if constexpr (float_lanes) simd::add_where(policy, bs.entropy_kept, k.entropy);
        else simd::accumulate(cs.entropy_kept, simd::select(policy, k.entropy, P(0.0)));
      }
      // Thirds: d = t - first falls in third floor(3 d / span), i.e. positions from cut1 on are
      // in the second, from cut2 on in the third; a pack that reaches past the next cut splits
      // its lanes.
      if (t + L <= thirds.next) {
        simd::add_where(k.valid, thirds.sum, k.variance);
        thirds.count.add(k.valid);
      } else {
        add_split(v, k, t, cs, thirds);
      }
    }
    if constexpr (Obj::kl_type::active) loss.kl += k.kl;  // 0 while a selectable term is off
    if (sums_entropy(f, diag)) {
      if constexpr (float_lanes) bs.entropy += k.entropy;
      else simd::accumulate(entropy, k.entropy);
    }
    cs.valid.add(k.valid);
  }
  // A pack that reaches past the next cut: each third's lanes in turn, the sum of a third it
  // leaves flushed (as rare as the cuts: one or two packs per response).
  static RECO_SIMD_INLINE void add_split(const response_values& v, const pack_terms& k, index_t t, chunk_sums& cs,
                        third_cursor& thirds) {
    const index_t end = t + L;
    M before_third = false;  // the lanes of the thirds already left
    for (;;) {
      const index_t x = thirds.next;
      const M before_next = io::first_lanes(x <= t ? 0 : (x >= end ? L : static_cast<int>(x - t)));
      const M lanes = k.valid && before_next && !before_third;
      thirds.sum += simd::select(lanes, k.variance, P(0.0));
      thirds.count.add(lanes);
      if (x >= end) return;
      before_third = before_next;
      thirds.flush(cs);
      thirds.enter(v, thirds.third + 1);
    }
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

// The tokens [t0, t1) of responses i, i + 1, ... (a chunk of reco::cpu's token pass),
// simd::width at a time; the scalar loop for advantages given per token (a pack's components read
// one advantage for all its lanes).
template <class Obj, class T>
struct packed_pass<token_fn<Obj, T>> {
  static constexpr bool available = packed_tokens<Obj, T>::supported;
  static void accumulate_chunk(const token_fn<Obj, T>& f, token_partial& p, index_t i, index_t t0, index_t t1) {
    if (f.b.token_advantages == nullptr) {
      simd::run_widest<packed_tokens<Obj, T>>(f, p, i, t0, t1);
      return;
    }
    const token_layout& layout = f.b.layout;
    for (index_t t = t0; t < t1;) {
      while (t >= layout.end(i)) ++i;
      const index_t stop = layout.end(i) < t1 ? layout.end(i) : t1;
      f.accumulate_range(p, i, t, stop);
      t = stop;
    }
  }
};

}  // namespace detail
RECO_NAMESPACE_END
#endif  // RECO_SIMD
