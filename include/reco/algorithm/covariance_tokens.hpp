// Clip-Cov / KL-Cov (reco/select/covariance.hpp) on the host: each token's selection value, the
// per-token flags of the selected tokens, and KL-Cov's |logp - old_logp| term added after the
// token pass. Host-only: the selection needs the final per-response advantages in host memory
// (CPU backends; the CUDA paths reject the selector).
//
// One definition serves a single call and a split step (reco/step_plan.hpp): the means are sums
// per response (lane_sum) added in response order, and a token is named by its response's
// index in the step and its position in the response, so that every part of a split step computes
// the values, and the step plan selects the tokens, that one call on the whole step would.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/backend/cpu/plan_scan.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/select/covariance.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Clip-Cov's reproducible order of the candidates: a seeded hash of the token's place in the step
// (its response's index, its position in the response), cut to 53 bits so that it is exact as a
// double (the selection ranks doubles; the rare equal keys go to the earlier token).
inline std::uint64_t subset_seed(double seed) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &seed, sizeof bits);
  return bits * 0xD1B54A32D192ED03ull;
}
inline std::uint64_t subset_place(index_t response, index_t position) {
  return (static_cast<std::uint64_t>(response) << 32) ^ static_cast<std::uint64_t>(position);
}
inline std::uint64_t covariance_subset_key(double seed, index_t response, index_t position) {
  return splitmix64(subset_seed(seed) ^ subset_place(response, position)) >> 11;
}

// k = max(1, floor(ratio N)) for N valid tokens (verl's int(ratio * N), at least 1); 0 when N = 0.
inline index_t covariance_count(double ratio, double n) {
  if (n < 1) return 0;
  const auto k = static_cast<index_t>(ratio * n);
  return k < 1 ? 1 : k;
}

// Over one response's valid tokens: their number, the sum of logp and, when the advantages are
// given per token, the sum of A_t (else 0: the response's A_i counts n times). A sum runs in 8
// interleaved lanes (token j of the range into lane j mod 8), added pairwise at the end: a fixed
// order, so one call and a step plan get the same bits whatever the width of the registers that
// run the lanes (lane_sum_pass: 8 / W packs of W). `valid` (not null, with a mask): the mask's set
// bytes counted in the same loop.
inline constexpr int sum_lanes = 8;
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
      auto block = [&](index_t b) {
        for (int p = 0; p < packs; ++p) {
          const auto ok = simd::valid_lanes<W, true>(mask + b + p * W, W);
          s[p] += simd::select(ok, simd::load<W>(x + b + p * W), P(0.0));  // read unmasked: no branch
          c[p] += simd::select(ok, P(1.0), P(0.0));
        }
      };
      // Chunks of masked tokens only (a padded row's tail) are skipped: a lane's sum starts at +0
      // and so never is -0, and adding +0 to it changes no bit.
      for (; t + mask_chunk <= e; t += mask_chunk) {
        prefetch_chunk_ahead(x + t, mask + t);
        if (chunk_masked(mask + t, mask_chunk)) continue;
        for (index_t b = t; b < t + mask_chunk; b += sum_lanes) block(b);
      }
      for (; t + sum_lanes <= e; t += sum_lanes) block(t);
    } else {
      for (; t + sum_lanes <= e; t += sum_lanes)
        for (int p = 0; p < packs; ++p) s[p] += simd::load<W>(x + t + p * W);
    }
    for (int p = 0; p < packs; ++p)
      for (int k = 0; k < W; ++k) {
        acc[p * W + k] = s[p][k];
        count[p * W + k] = c[p][k];
      }
  }
};
#endif
template <class T>
double lane_sum(const T* x, const std::uint8_t* mask, index_t t0, index_t e, std::uint64_t* valid = nullptr) {
  double acc[sum_lanes] = {}, count[sum_lanes] = {};
  index_t t = t0;
#if RECO_SIMD
  simd::run_widest<lane_sum_pass<T>>(x, mask, t, e, acc, count);
#else
  for (; t + sum_lanes <= e; t += sum_lanes)
    for (int j = 0; j < sum_lanes; ++j) {
      const bool ok = mask == nullptr || mask[t + j] != 0;
      acc[j] += ok ? static_cast<double>(x[t + j]) : 0.0;
      count[j] += ok ? 1.0 : 0.0;
    }
#endif
  for (int j = 0; t < e; ++t, ++j) {
    const bool ok = mask == nullptr || mask[t] != 0;
    acc[j] += ok ? static_cast<double>(x[t]) : 0.0;
    count[j] += ok ? 1.0 : 0.0;
  }
  if (valid && mask) {
    double n = 0;
    for (int j = 0; j < sum_lanes; ++j) n += count[j];
    *valid = static_cast<std::uint64_t>(n);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
struct covariance_sums {
  double n = 0, logp = 0, adv = 0;
};
// One read of the response's mask and logp (the count rides in the sum's loop).
template <class T>
covariance_sums response_covariance_sums(const batch_pointers<T>& b, index_t i) {
  covariance_sums s;
  const index_t t0 = b.layout.begin(i), e = b.layout.end(i);
  std::uint64_t n = e > t0 ? static_cast<std::uint64_t>(e - t0) : 0;
  s.logp = lane_sum(b.logp, b.mask, t0, e, &n);
  s.n = static_cast<double>(n);
  if (b.token_advantages) s.adv = lane_sum(b.token_advantages, b.mask, t0, e);
  return s;
}

// The population's means: mean A = sum_i (A-sum_i or n_i A_i) / N, mean logp = sum_i logp-sum_i / N,
// both summed over the responses in order (a split step adds the same per-response sums).
struct covariance_means {
  double n = 0, adv = 0, logp = 0;
};
inline void covariance_add(covariance_means& m, const covariance_sums& s, double response_adv, bool token_advantages) {
  m.n += s.n;
  m.adv += token_advantages ? s.adv : s.n * response_adv;
  m.logp += s.logp;
}
inline void covariance_finish(covariance_means& m) {
  m.adv = m.n > 0 ? m.adv / m.n : 0.0;
  m.logp = m.n > 0 ? m.logp / m.n : 0.0;
}

// One token's covariance (A_t - mean A)(logp_t - mean logp): every pass computes it with these
// operations, so that a call and a step plan rank the same bits.
inline double token_covariance(double a, double logp, const covariance_means& m) {
  return (a - m.adv) * (logp - m.logp);
}
// Clip-Cov: whether token t's PPO clip does not bind (verl's clip_by_origin: the clipped
// surrogate is the larger one), a condition of candidacy besides lb < cov < ub.
template <class Obj, class T>
bool clip_open(const Obj& obj, const batch_pointers<T>& b, index_t t, double a, double logp) {
  if constexpr (std::is_same_v<typename Obj::clip_type, ppo_clip>) {
    const double limit = obj.ratio.params.log_ratio_clamp;
    double l = b.old_logp ? logp - static_cast<double>(b.old_logp[t]) : 0.0;
    if (limit > 0) l = std::min(std::max(l, -limit), limit);
    const double x = std::exp(l);
    const double xc = std::min(std::max(x, 1.0 - obj.clip.params.eps_low), 1.0 + obj.clip.params.eps_high);
    return !(-a * xc > -a * x);
  } else {
    return true;
  }
}
// Clip-Cov: whether token t (advantage a, covariance cov) is a candidate: lb < cov < ub and its
// clip does not bind.
template <class Obj, class T>
bool clip_candidate(const Obj& obj, const batch_pointers<T>& b, index_t t, double a, double logp, double cov) {
  const auto& p = obj.select.params;
  return cov > p.lb && cov < p.ub && clip_open(obj, b, t, a, logp);
}
// Clip-Cov's selection value of a candidate: minus its subset key (the smallest keys win).
inline double clip_value(double seed, index_t response, index_t position) {
  return -static_cast<double>(covariance_subset_key(seed, response, position));
}
// Token t (valid, of response i starting at t0; advantage a) is selectable: its value into v.
template <class Obj, class T>
bool selection_value(const Obj& obj, const batch_pointers<T>& b, const covariance_means& m, index_t first_response,
                     index_t i, index_t t0, index_t t, double a, double& v) {
  const auto& p = obj.select.params;
  const double logp = static_cast<double>(b.logp[t]);
  const double cov = token_covariance(a, logp, m);
  if (p.mode == covariance_mode::kl) {
    v = cov;
    return true;
  }
  if (!clip_candidate(obj, b, t, a, logp, cov)) return false;
  v = clip_value(p.seed, first_response + i, t - t0);
  return true;
}

// Each token's selection value, where in[t] = 1 (else in[t] = 0 and value[t] is not read):
// KL-Cov: every valid token, value cov_t; Clip-Cov: the candidates (lb < cov_t < ub, clip not
// binding), value -key_t. The selected tokens are then the largest values, the earlier token of the
// step first on equal values: the k largest covariances, or the k smallest keys. `adv`: the final
// per-response advantages; `first_response`: the step index of the batch's first response.
template <class Obj, class T>
void covariance_values(const Obj& obj, const batch_pointers<T>& b, const double* adv, const covariance_means& m,
                       index_t first_response, double* value, std::uint8_t* in) {
  const auto& p = obj.select.params;
  const token_layout& L = b.layout;
  std::fill(in, in + L.tokens, std::uint8_t(0));
  if (p.mode == covariance_mode::kl) {
    // Every valid token: the mask is the batch's, the products run over whole ranges (a masked
    // slot's value is never read), so that the loops vectorise.
    for (index_t i = 0; i < L.responses; ++i) {
      const index_t t0 = L.begin(i), e = L.end(i);
      if (e <= t0) continue;
      if (b.mask) std::memcpy(in + t0, b.mask + t0, static_cast<std::size_t>(e - t0));
      else std::fill(in + t0, in + e, std::uint8_t(1));
      if (b.token_advantages) {
        for (index_t t = t0; t < e; ++t)
          value[t] = token_covariance(static_cast<double>(b.token_advantages[t]), static_cast<double>(b.logp[t]), m);
      } else {
        for (index_t t = t0; t < e; ++t) value[t] = token_covariance(adv[i], static_cast<double>(b.logp[t]), m);
      }
    }
    return;
  }
  for (index_t i = 0; i < L.responses; ++i)
    for (index_t t = L.begin(i), t0 = t, e = L.end(i); t < e; ++t)
      if (b.valid(t)) in[t] = selection_value(obj, b, m, first_response, i, t0, t, b.advantage_at(t, adv[i]), value[t]);
}

// ---- A step plan's candidates (reco/step_plan.hpp) ----------------------------------------------
//
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

// The buffers of covariance_values, kept by the thread (one call at a time; a step plan ranks its
// parts' candidates instead).
struct covariance_buffers {
  std::vector<double> value;
  std::vector<std::uint8_t> in;
  void size_for(index_t tokens) {
    value.resize(static_cast<std::size_t>(tokens));
    in.resize(static_cast<std::size_t>(tokens));
  }
};
inline covariance_buffers& thread_covariance_buffers() {
  thread_local covariance_buffers c;
  return c;
}

// flags[t] = 1 for the tokens one call on the whole batch selects, 0 otherwise (N entries).
// Returns the number selected.
template <class Obj, class T>
index_t covariance_select(const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                          std::uint8_t* flags) {
  const token_layout& L = b.layout;
  const index_t N = L.tokens;
  std::fill(flags, flags + N, std::uint8_t(0));
  covariance_means m;
  for (index_t i = 0; i < L.responses; ++i)
    covariance_add(m, response_covariance_sums(b, i), r.adv[i], b.token_advantages != nullptr);
  const index_t k = covariance_count(obj.select.params.ratio, m.n);
  if (k == 0) return 0;
  covariance_finish(m);
  covariance_buffers& buf = thread_covariance_buffers();
  buf.size_for(N);
  covariance_values(obj, b, r.adv, m, 0, buf.value.data(), buf.in.data());
  std::vector<index_t> cand;
  for (index_t t = 0; t < N; ++t)
    if (buf.in[static_cast<std::size_t>(t)]) cand.push_back(t);
  const std::size_t take = std::min(static_cast<std::size_t>(k), cand.size());
  const double* v = buf.value.data();
  if (take < cand.size())  // the largest values; on equal values the earlier token
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(take), cand.end(),
                     [v](index_t x, index_t y) { return v[x] != v[y] ? v[x] > v[y] : x < y; });
  for (std::size_t j = 0; j < take; ++j) flags[cand[j]] = 1;
  return static_cast<index_t>(take);
}

// KL-Cov: + coef |logp - old_logp| on the selected tokens' policy term, with the policy term's
// scale (aggregation coefficient, response weight, token weight). The subgradient at 0 is 0.
template <class Obj, class T>
void covariance_penalty(const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                        const std::uint8_t* flags, T* grad_logp, token_partial& tokens) {
  const double coef = obj.select.params.coef;
  const token_layout& L = b.layout;
  double loss = 0;
  for (index_t i = 0; i < L.responses; ++i) {
    const double scale_i = r.coef_policy[i] * r.weight[i];
    for (index_t t = L.begin(i); t < L.end(i); ++t) {
      if (!flags[t]) continue;
      const double d = b.old_logp ? static_cast<double>(b.logp[t]) - static_cast<double>(b.old_logp[t]) : 0.0;
      const double scale = b.token_weights ? scale_i * static_cast<double>(b.token_weights[t]) : scale_i;
      loss += scale * coef * std::fabs(d);
      const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
      grad_logp[t] = static_cast<T>(static_cast<double>(grad_logp[t]) + scale * coef * sign);
    }
  }
  tokens.policy += loss;
}

}  // namespace detail
RECO_NAMESPACE_END
