// Clip-Cov / KL-Cov over a split step: each part's candidates (covariance_candidates: one read of
// its logp with the step's means, every token left out below the step's cut) and its round of the
// plan (covariance_round): its first k candidates in the step's order as (value, response) pairs,
// or the radix rounds and counts on its candidates' values when that table would be too large.
// The values are those of reco/algorithm/covariance_tokens.hpp, so the plan selects the tokens one
// call on the whole step would.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/backend/cpu/plan_packs.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"
#include "reco/detail/radix_keys.hpp"
#include "reco/detail/token_chunks.hpp"
#include "reco/select/covariance.hpp"
#include "reco/step_plan/cut_candidates.hpp"
#include "reco/step_plan/part_state.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/summary.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// A part of a split step holds n_p selectable tokens; the step selects k. The part's k largest
// values contain every token of it the step selects, so the plan ranks only a superset of them:
// the part's tokens whose value is at least a threshold tau that leaves k or more of them above
// (or all of them). Every token left out is then below k candidates of its own part, so below the
// step's k-th value: it is neither selected nor on the cut. One read of the part's logp finds the
// candidates (a few per thousand); the plan's rounds and cut counts read only those.

// The threshold, from a sample of the part's chunks of mask_chunk slots (about `samples` slots:
// one chunk in every `stride`, an odd stride, the responses' chunks counted in order), a fraction
// f of the part's slots:
// - KL-Cov: the least of the sample's j largest values, j = max(least, spare k f), so that about
//   j / f >= spare k of the part's tokens lie at or above it; -inf (every valid token) when the
//   sample holds fewer than j.
// - Clip-Cov: its values are -key, and a token's key is a hash of its place, uniform on [0, 2^53)
//   and blind to the band. So the threshold need not be a quantile of sampled keys: from the
//   sample's candidates (in the band, clip not binding; no key computed) the part holds about
//   n = found / f, and the keys at most 2^53 e / n, e = spare k + least, take about e of them.
//   -inf (every candidate) when the sample finds fewer than `least` or e >= n. Before, the
//   threshold was the 16th largest sampled value and let a dozen times more candidates through,
//   each a clip check reading old_logp far from the last.
// These settings change the cost, never the plan: a part whose threshold leaves fewer than k
// tokens above it and some below gathers again from -inf.
struct covariance_sampling {
  index_t samples = 4096;
  double least = 16;
  double spare = 2;
};
template <class Obj, class T>
double covariance_threshold(const Obj& obj, const batch_pointers<T>& b, const double* adv, const covariance_means& m,
                            index_t k, const covariance_sampling& cs = {}) {
  const bool kl = obj.select.params.mode == covariance_mode::kl;
  const token_layout& L = b.layout;
  std::int64_t chunks = 0, slots = 0;
  for (index_t i = 0; i < L.responses; ++i) {
    const index_t len = L.end(i) - L.begin(i);
    if (len <= 0) continue;
    chunks += (len + mask_chunk - 1) / mask_chunk;
    slots += len;
  }
  const std::int64_t per = cs.samples / mask_chunk > 0 ? cs.samples / mask_chunk : 1;  // chunks sampled
  const std::int64_t stride = chunks / per > 1 ? (chunks / per) | 1 : 1;
  thread_local std::vector<double> values;  // KL-Cov: the sample's values
  values.clear();
  std::int64_t sampled = 0, seen = 0, next = 0, found = 0;  // found: Clip-Cov's sampled candidates
  for (index_t i = 0; i < L.responses; ++i) {
    const index_t t0 = L.begin(i), e = L.end(i);
    if (e <= t0) continue;
    const std::int64_t n = (e - t0 + mask_chunk - 1) / mask_chunk;
    for (; next < seen + n; next += stride) {
      const index_t c = t0 + static_cast<index_t>(next - seen) * mask_chunk, end = std::min(e, c + mask_chunk);
      sampled += end - c;
      for (index_t t = c; t < end; ++t) {
        if (!b.valid(t)) continue;
        const double a = b.advantage_at(t, adv[i]), logp = static_cast<double>(b.logp[t]);
        const double cov = token_covariance(a, logp, m);
        if (kl) values.push_back(cov);
        else found += clip_candidate(obj, b, t, a, logp, cov);
      }
    }
    seen += n;
  }
  if (sampled == 0) return -HUGE_VAL;
  const double f = static_cast<double>(sampled) / static_cast<double>(slots);
  if (!kl) {
    const double e = cs.spare * static_cast<double>(k) + cs.least, n = static_cast<double>(found) / f;
    if (static_cast<double>(found) < cs.least || e >= n) return -HUGE_VAL;
    return -std::floor(e / n * 9007199254740992.0);  // 2^53: the keys' range
  }
  const double j = std::ceil(std::max(cs.least, cs.spare * static_cast<double>(k) * f));
  if (j > static_cast<double>(values.size())) return -HUGE_VAL;
  const auto at = values.begin() + static_cast<std::ptrdiff_t>(j) - 1;
  std::nth_element(values.begin(), at, values.end(), [](double x, double y) { return x > y; });
  return *at;
}

// The logp interval [lo, hi] outside which no token of a response with d = A_i - mean A can be
// flagged: KL-Cov cov >= tau, Clip-Cov lb < cov < ub, for cov = token_covariance. Each end starts
// at the rounded solution of d (x - mean logp) = bound and steps (in T) until its own covariance
// proves it outside, so rounding never leaves a flagged token out. Returns false when no such
// interval is found (d = 0, tau = -inf, overflow): then every token takes the exact test.
template <class T>
bool logp_range(double d, const covariance_means& m, bool kl, double tau, double lb, double ub, T& lo, T& hi) {
  if (!(d != 0) || !std::isfinite(d)) return false;
  const covariance_means at{0, 0, m.logp};  // token_covariance(d, x, at) = d (x - mean logp)
  auto cov = [&](T x) { return token_covariance(d, static_cast<double>(x), at); };
  const T inf = std::numeric_limits<T>::infinity();
  // The end below (down) or above the interval, from the bound b: `outside(x)` must hold there.
  auto end = [&](double b, bool down, auto outside) {
    const double x0 = m.logp + b / d;
    if (!(std::fabs(x0) <= static_cast<double>(std::numeric_limits<T>::max()))) return down ? -inf : inf;
    T x = static_cast<T>(x0);
    for (int step = 0; step < 64; ++step) {
      if (outside(x)) return x;
      x = std::nextafter(x, down ? -inf : inf);
    }
    return down ? -inf : inf;
  };
  if (kl) {
    if (!std::isfinite(tau)) return false;
    auto below = [&](T x) { return !(cov(x) >= tau); };
    lo = d > 0 ? end(tau, true, below) : -inf;
    hi = d > 0 ? inf : end(tau, false, below);
  } else {
    auto under_lb = [&](T x) { return cov(x) <= lb; };
    auto over_ub = [&](T x) { return cov(x) >= ub; };
    lo = d > 0 ? end(lb, true, under_lb) : end(ub, true, over_ub);
    hi = d > 0 ? end(ub, false, over_ub) : end(lb, false, under_lb);
  }
  return lo > -inf || hi < inf;
}

// One read of a part's tokens: those whose value is at least tau into `out` (keys: order_key_bits
// of the values; their responses), their prefixes the whole range; every selectable token when
// tau = -inf. `left` += the tokens that may be selectable and lie below tau (a Clip-Cov token in
// the band counted without its clip check). A chunk's flags are computed branch-free (the loops
// vectorise; Clip-Cov's value -key >= tau is key <= -tau there, an exact integer), the few
// tokens flagged then one by one.
//
// With per-response advantages a response's covariance d (x - mean logp), d = A_i - mean A, is
// monotone in its logp x, so the tokens that can be flagged (KL-Cov: cov >= tau; Clip-Cov: in
// the band) have logp in one interval [lo, hi] of the input's type (logp_range). A chunk's logp is
// first compared with it in that type, until the first chunk with a logp inside: from there the
// response's chunks read their mask and take the exact flags in double. A response that cannot
// reach the threshold or the band (most of a part for KL-Cov, those with a small |d| for
// Clip-Cov) then costs its logp alone (4 bytes a token in float instead of 5, no products and
// no hashes), KL-Cov's counting its valid tokens from the summaries.
template <class Obj, class T>
struct covariance_gather_pass {
  struct bounds {
    double tau, lb, ub;
    std::uint64_t seed, key_limit;  // Clip-Cov: subset_seed, and the largest key at or above tau
  };
  // A chunk's flags: KL-Cov, valid and cov >= tau; Clip-Cov, valid, lb < cov < ub and key <=
  // key_limit (place0: the subset_place of the chunk's first token). `under` += the valid (KL) or
  // in-band (clip) tokens not flagged. Returns whether any flag is set.
  template <bool Kl, bool TokenAdv>
  static RECO_PLAN_PASS unsigned chunk_flags(const T* lp, const T* ta, const std::uint8_t* mk, index_t n, double a_i,
                                             const covariance_means& m, const bounds& g, std::uint64_t place0,
                                             std::uint8_t* hit, std::int64_t& under) {
    unsigned any = 0, below = 0;
    for (index_t j = 0; j < n; ++j) {
      const double a = TokenAdv ? static_cast<double>(ta[j]) : a_i;
      const double cov = token_covariance(a, static_cast<double>(lp[j]), m);
      const unsigned ok = mk ? static_cast<unsigned>(mk[j] != 0) : 1u;
      unsigned h;
      if constexpr (Kl) {
        h = ok & static_cast<unsigned>(cov >= g.tau);
        below += ok ^ h;
      } else {
        const unsigned band = ok & static_cast<unsigned>(cov > g.lb) & static_cast<unsigned>(cov < g.ub);
        const std::uint64_t key = splitmix64(g.seed ^ (place0 + static_cast<std::uint64_t>(j))) >> 11;
        h = band & static_cast<unsigned>(key <= g.key_limit);
        below += band ^ h;
      }
      hit[j] = static_cast<std::uint8_t>(h);
      any |= h;
    }
    under += below;
    return any;
  }

  // Whether a chunk holds a slot with logp in [lo, hi] (valid or not: the mask is not read).
  static RECO_PLAN_PASS bool chunk_in_range(const T* lp, index_t n, T lo, T hi) {
    std::uint8_t any = 0;
    for (index_t j = 0; j < n; ++j)
      any |= static_cast<std::uint8_t>(static_cast<std::uint8_t>(lp[j] >= lo) & static_cast<std::uint8_t>(lp[j] <= hi));
    return any != 0;
  }

  // `skip`: chunks may be skipped on their logp alone. A skipped chunk holds no token in Clip-Cov's
  // band; KL-Cov's valid tokens in it are missing from `left`, which covariance_candidates then
  // takes as the part's valid tokens less its candidates instead.
  template <int W>
  static RECO_PLAN_PASS void run(const Obj& obj, const batch_pointers<T>& b, const double* const& adv,
                                 const covariance_means& m, const index_t& first_response, const double& tau,
                                 const bool& skip, cut_candidates& out, std::int64_t& left) {
    const auto& p = obj.select.params;
    const bool kl = p.mode == covariance_mode::kl;
    bounds g{tau, p.lb, p.ub, subset_seed(p.seed), ~std::uint64_t(0)};
    if (!kl && tau > -HUGE_VAL) g.key_limit = -tau >= 0 ? static_cast<std::uint64_t>(-tau) : 0;
    const token_layout& L = b.layout;
    const std::uint8_t* mk = b.mask;
    std::uint8_t hit[mask_chunk];
    struct flagged {
      index_t t, i;  // the token and its response
    };
    thread_local std::vector<flagged> held;
    held.clear();
    for (index_t i = 0; i < L.responses; ++i) {
      const index_t t0 = L.begin(i), e = L.end(i);
      T lo{}, hi{};
      bool ranged = skip && !b.token_advantages && logp_range(adv[i] - m.adv, m, kl, tau, p.lb, p.ub, lo, hi);
      for (index_t c = t0; c < e; c += mask_chunk) {
        const index_t n = e - c < mask_chunk ? e - c : mask_chunk;
        if (ranged) {  // the mask only for the chunks that hold a logp in range
          prefetch_chunk_ahead(b.logp + c, nullptr);
          if (!chunk_in_range(b.logp + c, n, lo, hi)) continue;
          // The response's chunks after its first in range all take the exact flags: a response
          // that reaches the threshold or the band mostly does so in every chunk.
          ranged = false;
        } else {
          prefetch_chunk_ahead(b.logp + c, mk ? mk + c : nullptr);
        }
        if (mk && chunk_masked(mk + c, n)) continue;
        const T* lp = b.logp + c;
        const T* ta = b.token_advantages ? b.token_advantages + c : nullptr;
        const std::uint8_t* mc = mk ? mk + c : nullptr;
        const std::uint64_t place0 = subset_place(first_response + i, c - t0);
        unsigned any = 0;
        if (kl) {
          any = ta ? chunk_flags<true, true>(lp, ta, mc, n, 0.0, m, g, place0, hit, left)
                   : chunk_flags<true, false>(lp, ta, mc, n, adv[i], m, g, place0, hit, left);
        } else {
          any = ta ? chunk_flags<false, true>(lp, ta, mc, n, 0.0, m, g, place0, hit, left)
                   : chunk_flags<false, false>(lp, ta, mc, n, adv[i], m, g, place0, hit, left);
        }
        if (!any) continue;
        for (std::uint64_t bits = flag_bits(hit, n); bits; bits &= bits - 1) {
          const index_t t = c + static_cast<index_t>(__builtin_ctzll(bits));
          if (!kl) {
            held.push_back({t, i});  // its clip is checked after the read
            continue;
          }
          const double v = token_covariance(b.advantage_at(t, adv[i]), static_cast<double>(b.logp[t]), m);
          out.keys.push_back(order_key_bits(v));
          out.responses.push_back(i);
        }
      }
    }
    // Clip-Cov's flagged tokens, in token order: their old_logp lie far apart and, read one by one
    // inside the loop, each waited for memory; here each is asked for a few tokens ahead.
    constexpr std::size_t ahead = 8;
    for (std::size_t j = 0; j < held.size(); ++j) {
#if defined(__GNUC__)
      if (b.old_logp && j + ahead < held.size()) __builtin_prefetch(b.old_logp + held[j + ahead].t);
#endif
      const flagged& h = held[j];
      if (!clip_open(obj, b, h.t, b.advantage_at(h.t, adv[h.i]), static_cast<double>(b.logp[h.t]))) continue;
      out.keys.push_back(order_key_bits(clip_value(p.seed, first_response + h.i, h.t - L.begin(h.i))));
      out.responses.push_back(h.i);
    }
  }
};

// A part's candidates for a plan that selects k tokens of the step (see above): at least
// min(k, selectable) tokens, every token left out below all of them. Returns whether any
// selectable token was left out (then the part holds k candidates or more). `valid` (optional):
// the part's valid tokens, which lets KL-Cov's read skip chunks without reading their mask.
template <class Obj, class T>
bool covariance_candidates(const Obj& obj, const batch_pointers<T>& b, const double* adv, const covariance_means& m,
                           index_t first_response, index_t k, cut_candidates& out,
                           const covariance_sampling& cs = {}, std::int64_t valid = -1) {
  const bool kl = obj.select.params.mode == covariance_mode::kl;
  const bool skip = !kl || valid >= 0;
  auto gather = [&](double tau) {
    std::int64_t left = 0;
    out.reset(0, 0, 0, b.layout.responses);
#if RECO_SIMD
    simd::run_widest<covariance_gather_pass<Obj, T>>(obj, b, adv, m, first_response, tau, skip, out, left);
#else
    covariance_gather_pass<Obj, T>::template run<1>(obj, b, adv, m, first_response, tau, skip, out, left);
#endif
    // KL-Cov takes every valid token at or above tau: the rest are left out.
    return kl && skip ? valid - static_cast<std::int64_t>(out.keys.size()) : left;
  };
  const double tau = covariance_threshold(obj, b, adv, m, k, cs);
  std::int64_t left = gather(tau);
  if (left > 0 && static_cast<index_t>(out.keys.size()) < k) left = gather(-HUGE_VAL);
  return left > 0;
}


// A covariance selection's round for a part: its candidates (covariance_candidates, gathered
// once per plan into the state, or every round without one) narrowed to the plan's prefix and
// counted by their next digit, or per response above and on the cut. The tokens left out lie
// below the cut, on no digit the rounds look at.
template <class Obj, class T>
void covariance_round(const Obj& obj, const step_plan& plan, const batch_pointers<T>& b, const step_part& part,
                      part_rounds* state, step_summary& s) {
  const index_t R = b.layout.responses;
  part_rounds scratch;
  part_rounds& st = state ? *state : scratch;
  cut_candidates& c = st.candidates;
  if (!gathered_for(st, plan, part, R, b.logp)) {
    st.plan = plan.serial();
    st.pending = st.window = 0;
    st.first_response = part.first_response;
    st.responses = R;
    st.entropy = b.logp;
    covariance_means m;
    m.adv = plan.covariance_adv_mean();
    m.logp = plan.covariance_logp_mean();
    std::int64_t valid = 0;  // the part's valid tokens (the summaries counted them)
    for (index_t i = 0; i < R; ++i) valid += plan.valid_tokens(part.first_response + i);
    st.left_out = covariance_candidates(obj, b, plan.advantages().data() + part.first_response, m,
                                        part.first_response, plan.selected_count(), c, {}, valid);
  }
  double* out = s.values.data() + plan_header;
  constexpr int W = 64;
  if (plan.stage() == step_plan::stage_kind::top_values) {
    // The part's first k candidates in the step's order (all of them when fewer) as (value,
    // response) pairs in its slots; the last slot counts the parts that sent fewer than all their
    // selectable tokens.
    const auto K = static_cast<std::size_t>(plan.selected_count());
    out[plan.round_body() - 1] = st.left_out || c.keys.size() > K ? 1 : 0;  // after every part's slots
    if (R == 0) return;
    const index_t p = plan.part_slot(part.first_response);
    require(p >= 0, "part.first_response", "starts no part of the step's summaries (" +
                                               std::to_string(part.first_response) + ")");
    thread_local std::vector<std::size_t> order;
    order.resize(c.keys.size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    const std::size_t n = std::min(K, order.size());
    if (n < order.size())
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                       [&c](std::size_t a, std::size_t b) {
                         return before_in_step(c.keys[a], c.responses[a], c.keys[b], c.responses[b]);
                       });
    double* slot = out + static_cast<std::size_t>(p) * plan.part_top_values();
    slot[0] = static_cast<double>(n);
    for (std::size_t j = 0; j < n; ++j) {
      slot[1 + 2 * j] = key_value(c.keys[order[j]], sizeof(double));
      slot[2 + 2 * j] = static_cast<double>(part.first_response + c.responses[order[j]]);
    }
  } else if (plan.stage() == step_plan::stage_kind::histogram) {
    const int done = plan.round() * plan_digit_bits;
    if (done > 0) c.narrow(W, done, plan.prefix(0), plan.prefix(0));
    const int shift = W - done - plan_digit_bits;
    for (const std::uint64_t k : c.keys) histogram_add(out, (k >> shift) & (plan_buckets - 1), 1);
    if (plan.round() == 0) out[plan_histogram] = st.left_out ? 1 : 0;
  } else {
    const double cut = plan.cut().value;
    for (index_t i = 0; i < R; ++i) out[2 * (part.first_response + i)] = static_cast<double>(c.above[static_cast<std::size_t>(i)]);
    for (std::size_t k = 0; k < c.keys.size(); ++k) {
      const double x = key_value(c.keys[k], sizeof(double));
      double* o = out + 2 * (part.first_response + c.responses[k]);
      o[0] += x > cut;
      o[1] += x == cut;
    }
  }
}

}  // namespace detail
RECO_NAMESPACE_END
