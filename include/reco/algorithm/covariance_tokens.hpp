// Clip-Cov / KL-Cov (reco/select/covariance.hpp) on the host: each token's selection value, the
// per-token flags of the selected tokens, and KL-Cov's |logp - old_logp| term added after the
// token pass. Host-only: the selection needs the final per-response advantages in host memory
// (host-accessible backends; a device backend refuses the selector at compile time).
//
// One definition serves a single call and a split step (the step plan's covariance rounds,
// reco/step_plan/covariance_rounds.hpp): the means are sums per response (lane_sum) added in
// response order, and a token is named by its response's index in the step and its position in
// the response, so that every part of a split step computes the values, and the step plan
// selects the tokens, that one call on the whole step would. The sums' form on SIMD packs is the
// CPU backend's (reco/backend/cpu/packed_covariance.hpp).
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
#include "reco/algorithm/top_k_stream.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/detail/token_chunks.hpp"
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
// run the lanes (the CPU backend's packed form runs 8 / W packs of W). `valid` (not null, with a
// mask): the mask's set bytes counted in the same loop.
inline constexpr int sum_lanes = 8;
// The lanes' tail from token t (fewer than sum_lanes left) and their pairwise sum.
template <class T>
double lane_sum_finish(double* acc, double* count, const T* x, const std::uint8_t* mask, index_t t, index_t e,
                       std::uint64_t* valid) {
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
struct lane_sum_fn {
  template <class T>
  double operator()(const T* x, const std::uint8_t* mask, index_t t0, index_t e, std::uint64_t* valid = nullptr) const {
    double acc[sum_lanes] = {}, count[sum_lanes] = {};
    index_t t = t0;
    for (; t + sum_lanes <= e; t += sum_lanes)
      for (int j = 0; j < sum_lanes; ++j) {
        const bool ok = mask == nullptr || mask[t + j] != 0;
        acc[j] += ok ? static_cast<double>(x[t + j]) : 0.0;
        count[j] += ok ? 1.0 : 0.0;
      }
    return lane_sum_finish(acc, count, x, mask, t, e, valid);
  }
};
struct covariance_sums {
  double n = 0, logp = 0, adv = 0;
};
// One read of the response's mask and logp (the count rides in the sum's loop), with the lane
// sums of `sum` (lane_sum_fn, or the CPU backend's packed form: the same bits).
template <class T, class Sum = lane_sum_fn>
covariance_sums response_covariance_sums(const batch_pointers<T>& b, index_t i, Sum sum = {}) {
  covariance_sums s;
  const index_t t0 = b.layout.begin(i), e = b.layout.end(i);
  std::uint64_t n = e > t0 ? static_cast<std::uint64_t>(e - t0) : 0;
  s.logp = sum(b.logp, b.mask, t0, e, &n);
  s.n = static_cast<double>(n);
  if (b.token_advantages) s.adv = sum(b.token_advantages, b.mask, t0, e);
  return s;
}
// Per response i: its sums into out[i] (a pass of the backend, which may run it on packs).
template <class T>
struct covariance_sums_fn {
  batch_pointers<T> b;
  covariance_sums* out;
  void operator()(index_t i) const { out[i] = response_covariance_sums(b, i); }
};

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

// A token read once and kept for later tests: its place and its logp (the sampled tokens the
// selection's estimates start from, and the tokens a block test on the sampled mean let through).
struct covariance_token {
  index_t t, response;
  double logp;
};

// The scratch of a selection, kept per thread between calls: the values and flags of the
// planned path (covariance_values), the per-response sums, the streams of the single call and
// the selected tokens.
struct covariance_buffers {
  std::vector<double> value;
  std::vector<std::uint8_t> in;
  std::vector<covariance_sums> sums;  // per response
  std::vector<top_k_stream> streams;  // per chunk of responses
  std::vector<std::vector<std::uint64_t>> hits;  // per chunk: a response's blocks that hit
  std::vector<std::vector<covariance_token>> candidates;  // per chunk (the sampled-mean path)
  std::vector<covariance_token> sample;  // the sampled tokens (covariance_least)
  std::vector<index_t> chunk_first;   // the chunks' first responses, and R at the end
  std::vector<ranked_item> merged;
  std::vector<index_t> selected;  // the selected tokens, increasing
  void size_for(index_t tokens) {
    value.resize(static_cast<std::size_t>(tokens));
    in.resize(static_cast<std::size_t>(tokens));
  }
};
inline covariance_buffers& thread_covariance_buffers() {
  thread_local covariance_buffers c;
  return c;
}

// The blocks of `covariance_block` tokens of response range [t0, e) that hold a token (valid or
// not: a masked token's false hit only costs the exact test) with lo < cov <= hi and, where
// `keyed` (Clip-Cov), a subset key below key_below: bit j of hits[j / 64] for the block from
// t0 + j * covariance_block. A pass of one call (for_each(1, ..)), which the CPU backend runs on
// packs (reco/backend/cpu/packed_covariance.hpp).
inline constexpr index_t covariance_block = 16;
template <class T>
struct covariance_block_hits_fn {
  batch_pointers<T> b;
  double response_adv, lo, hi;
  covariance_means m;
  index_t t0, e;
  std::uint64_t* hits;
  bool keyed = false;
  std::uint64_t seed_bits = 0, key_below = 0;  // subset_seed(seed); the keys let through are < key_below
  index_t response = 0;
  // Keyed, where given: a packed test may append the valid tokens that pass to it, in token order,
  // instead of marking their blocks (it knows them already); the blocks it marks come after them.
  std::vector<covariance_token>* passed = nullptr;
  // The blocks of [t, e), the first of them block j.
  void blocks_from(index_t t, index_t j) const {
    for (; t < e; t += covariance_block, ++j) {
      const index_t stop = std::min(t + covariance_block, e);
      bool hit = false;
      for (index_t u = t; u < stop; ++u) {
        const double cov = token_covariance(b.advantage_at(u, response_adv), static_cast<double>(b.logp[u]), m);
        bool in = cov > lo && cov <= hi;
        if (keyed) in = in && (splitmix64(seed_bits ^ subset_place(response, u - t0)) >> 11) < key_below;
        hit |= in;
      }
      if (j % 64 == 0) hits[j / 64] = 0;
      hits[j / 64] |= static_cast<std::uint64_t>(hit) << (j % 64);
    }
  }
  void operator()(index_t) const { blocks_from(t0, 0); }
};

// One response's sums into *out and its block test, together: one read of its logp and mask (the
// CPU backend runs both in one loop, reco/backend/cpu/packed_covariance.hpp).
template <class T>
struct covariance_response_fn {
  covariance_block_hits_fn<T> test;
  covariance_sums* out;
  index_t response;
  void operator()(index_t) const {
    *out = response_covariance_sums(test.b, response);
    test(0);
  }
};

// Valid token u (position u - t0 of response i; advantage a) into stream s if the stream admits
// its selection value on the exact means m. Clip-Cov: the band, then the key the stream may
// admit, and only then the clip test with its exponential (clip_candidate's conditions, cheapest
// first: most tokens in the band have a key the full stream turns away).
template <class Obj, class T>
void offer(const Obj& obj, const batch_pointers<T>& b, const covariance_means& m, top_k_stream& s, index_t i,
           index_t t0, index_t u, double a, double logp) {
  const auto& p = obj.select.params;
  const double cov = token_covariance(a, logp, m);
  if (p.mode == covariance_mode::kl) {
    if (s.admits(cov)) s.push(cov, u);
    return;
  }
  if (!(cov > p.lb && cov < p.ub)) return;
  const double v = clip_value(p.seed, i, u - t0);
  if (s.admits(v) && clip_open(obj, b, u, a, logp)) s.push(v, u);
}

// The valid tokens of responses [r0, r1) whose selection value the stream admits, pushed in
// token order. Each response's blocks are tested first, with the bounds at the response's start
// (KL-Cov: above the k-th best so far, which only rises; Clip-Cov: inside (lb, ub)), and the
// exact test, the clip test and the key run only in the blocks that hit: the rest of the tokens
// cannot enter. (KL-Cov takes every token until the stream holds k.)
template <class Backend, class Obj, class T>
void covariance_stream(const Backend& be, const Obj& obj, const batch_pointers<T>& b, const double* adv,
                       const covariance_means& m, index_t r0, index_t r1, top_k_stream& s,
                       std::vector<std::uint64_t>& hits) {
  const auto& p = obj.select.params;
  const bool kl = p.mode == covariance_mode::kl;
  const token_layout& L = b.layout;
  auto exact = [&](index_t i, index_t t0, index_t t, index_t stop) {
    for (index_t u = t; u < stop; ++u)
      if (b.valid(u)) offer(obj, b, m, s, i, t0, u, b.advantage_at(u, adv[i]), static_cast<double>(b.logp[u]));
  };
  for (index_t i = r0; i < r1; ++i) {
    const index_t t0 = L.begin(i), e = L.end(i);
    if (e <= t0) continue;
    if (kl && !s.full() && s.least() == -HUGE_VAL) {
      exact(i, t0, t0, e);
      continue;
    }
    // KL-Cov's blocks: above the k-th best once the stream holds k, else at least `least` (the
    // test is cov > lo, and the double below least makes it cov >= least).
    const double lo = !kl ? p.lb : (s.full() ? s.floor() : std::nextafter(s.least(), -HUGE_VAL));
    const index_t blocks = (e - t0 + covariance_block - 1) / covariance_block;
    hits.resize(static_cast<std::size_t>((blocks + 63) / 64));
    covariance_block_hits_fn<T> test{b, adv[i], lo, kl ? HUGE_VAL : p.ub, m, t0, e, hits.data()};
    if (!kl && (s.full() || s.least() > -HUGE_VAL)) {
      // Clip-Cov's blocks, once the stream turns keys away: the value -key is admitted above the
      // floor (key < -floor) or, before, from `least` on (key <= -least); both are integers.
      test.keyed = true;
      test.seed_bits = subset_seed(p.seed);
      test.key_below = s.full() ? static_cast<std::uint64_t>(-s.floor()) : static_cast<std::uint64_t>(-s.least()) + 1;
      test.response = i;
    }
    be.for_each(1, test);
    for (index_t w = 0; w * 64 < blocks; ++w)
      for (std::uint64_t bits = hits[static_cast<std::size_t>(w)]; bits != 0; bits &= bits - 1) {
        const index_t t = t0 + (w * 64 + __builtin_ctzll(bits)) * covariance_block;
        exact(i, t0, t, std::min(t + covariance_block, e));
      }
  }
}

// From this many tokens a call's streams start from a least value estimated on a sample.
inline constexpr index_t sampled_covariance_from = index_t(1) << 18;
inline constexpr index_t covariance_samples = index_t(1) << 14;

// The valid tokens at covariance_samples evenly spaced positions (all of them below that many
// tokens), kept with their logp: each a cache miss, so read once for the
// estimates below.
template <class T>
void sample_covariance_tokens(const batch_pointers<T>& b, std::vector<covariance_token>& out) {
  const token_layout& L = b.layout;
  const index_t N = L.tokens, S = std::min(N, covariance_samples);
  out.clear();
  constexpr index_t ahead = 32;  // ask for later samples while waiting for this one
  index_t i = 0;
  for (index_t j = 0; j < S; ++j) {
    const index_t t = sample_position(j, N, S);
    if (j + ahead < S) {
      const index_t u = sample_position(j + ahead, N, S);
      __builtin_prefetch(b.logp + u);
      if (b.mask) __builtin_prefetch(b.mask + u);
    }
    while (i < L.responses && L.end(i) <= t) ++i;
    if (i == L.responses) break;
    if (t < L.begin(i) || !b.valid(t)) continue;
    out.push_back({t, i, static_cast<double>(b.logp[t])});
  }
}

// The mean logp of the sampled tokens, and `spread`, the distance from it within which the
// batch's mean lies all but rarely: 6 standard errors (and a relative 1e-9). Where the sample holds
// fewer than 1,024 tokens with a finite logp, spread is +inf.
struct sampled_mean {
  double mean = 0, spread = HUGE_VAL;
};
inline sampled_mean sampled_logp_mean(const std::vector<covariance_token>& sample) {
  double mean = 0, m2 = 0;  // Welford's running mean and sum of squared deviations
  index_t n = 0;
  for (const covariance_token& x : sample) {
    if (!(x.logp - x.logp == 0)) continue;  // NaN or inf: the token pass reports it
    ++n;
    const double d = x.logp - mean;
    mean += d / static_cast<double>(n);
    m2 += d * (x.logp - mean);
  }
  sampled_mean s;
  if (n < 1024) return s;
  s.mean = mean;
  s.spread = 6.0 * std::sqrt(m2 / static_cast<double>(n - 1) / static_cast<double>(n)) + 1e-9 * (1.0 + std::fabs(mean));
  return s;
}

// A value at most the k-th best selection value of the batch, all but rarely: the selection
// values of the sampled tokens that are selectable, and among them the j-th largest,
// j = e + 5 sqrt(e) + 16 where e = k S / N is the sample's expected share of the k best. -inf where
// the sample holds fewer than j selectable tokens. The streams admit nothing below it until
// they hold k items; a pass that admits fewer than k in all proves it too high, and runs again
// without it (covariance_select).
template <class Obj, class T>
double covariance_least(const Obj& obj, const batch_pointers<T>& b, const double* adv, const covariance_means& m,
                        index_t k, const std::vector<covariance_token>& sample) {
  const auto& p = obj.select.params;
  const index_t N = b.layout.tokens, S = std::min(N, covariance_samples);
  std::vector<double> values;
  values.reserve(sample.size());
  const bool clip = p.mode == covariance_mode::clip;
  constexpr std::size_t ahead = 32;  // Clip-Cov's clip test reads old_logp: a miss each
  for (std::size_t j = 0; j < sample.size(); ++j) {
    if (clip && b.old_logp && j + ahead < sample.size()) __builtin_prefetch(b.old_logp + sample[j + ahead].t);
    const covariance_token& x = sample[j];
    const double a = b.advantage_at(x.t, adv[x.response]);
    const double cov = token_covariance(a, x.logp, m);
    // (A NaN covariance, from a log-probability the token pass then reports, is left out:
    // nth_element needs an order; the streams turn NaN away too.)
    if (!clip) {
      if (cov == cov) values.push_back(cov);
    } else if (clip_candidate(obj, b, x.t, a, x.logp, cov)) {
      values.push_back(clip_value(p.seed, x.response, x.t - b.layout.begin(x.response)));
    }
  }
  const double e = static_cast<double>(k) * static_cast<double>(S) / static_cast<double>(N);
  const auto j = static_cast<std::size_t>(std::ceil(e + 5.0 * std::sqrt(e) + 16.0));
  if (j > values.size()) return -HUGE_VAL;
  const auto jth = values.begin() + static_cast<std::ptrdiff_t>(j - 1);
  std::nth_element(values.begin(), jth, values.end(), [](double x, double y) { return x > y; });
  return *jth;
}

// The chunks of responses that streams run on: at most 16, of at least 2^16 tokens; their first
// responses into `first`, then R. Returns their number.
inline std::size_t covariance_chunks(const token_layout& L, std::vector<index_t>& first) {
  constexpr index_t max_chunks = 16, min_chunk = index_t(1) << 16;
  const index_t chunk_tokens = std::max(min_chunk, (L.tokens + max_chunks - 1) / max_chunks);
  first.clear();
  for (index_t i = 0; i < L.responses; ++i)
    if (first.empty() || L.begin(i) - L.begin(first.back()) >= chunk_tokens) first.push_back(i);
  const std::size_t chunks = first.size();
  first.push_back(L.responses);
  return chunks;
}

// One call's selection on a sampled mean, from sampled_covariance_from tokens with the advantages
// per response: the per-response sums of logp (for the exact means) and the block tests read each
// response once, from memory and then from the cache, with the tests run on the mean of a sample
// (sampled_logp_mean) and their bounds widened by what its distance `spread` from the exact mean
// can move a covariance: |A_i - mean A| spread, plus a relative 2^-40 for the roundings. The tokens
// that pass are kept with their logp; once the sums give the exact mean, and it lies within
// spread of the sample's, the streams take them on the exact covariances, in token order as
// covariance_stream would: every token it would push passed the wider test, so the selection is
// the same. Returns false, having selected nothing, where the sample cannot decide (too few
// tokens, the exact mean outside its spread, fewer than k tokens at the sampled least value):
// the caller then runs the exact passes.
template <class Backend, class Obj, class T>
bool covariance_select_sampled(const Backend& be, const Obj& obj, const batch_pointers<T>& b,
                               const response_scratch& r, covariance_buffers& buf, std::size_t chunks,
                               std::vector<index_t>& selected) {
  const auto& p = obj.select.params;
  const bool kl = p.mode == covariance_mode::kl;
  const token_layout& L = b.layout;
  const double* adv = r.adv;
  // The counts and the mean advantage as the sums will give them (the valid counts are the
  // scan's); the mean logp from the sample.
  covariance_means est;
  for (index_t i = 0; i < L.responses; ++i)
    covariance_add(est, covariance_sums{static_cast<double>(r.length[i]), 0.0, 0.0}, adv[i], false);
  const index_t k = covariance_count(p.ratio, est.n);
  if (k == 0) return false;
  covariance_finish(est);
  sample_covariance_tokens(b, buf.sample);
  const sampled_mean sample = sampled_logp_mean(buf.sample);
  if (!(sample.spread < HUGE_VAL)) return false;
  est.logp = sample.mean;
  const double least = covariance_least(obj, b, adv, est, k, buf.sample);
  if (!(least > -HUGE_VAL)) return false;

  const double spread = sample.spread * (1 + 0x1p-40);
  const std::uint64_t seed_bits = subset_seed(p.seed);
  // Clip-Cov's streams admit -key >= least: keys up to -least (an integer).
  const std::uint64_t key_below = kl ? 0 : static_cast<std::uint64_t>(-least) + 1;
  const double bound = kl ? std::fabs(least) : std::max(std::fabs(p.lb), std::fabs(p.ub));
  if (buf.candidates.size() < chunks) buf.candidates.resize(chunks);
  covariance_sums* sums = buf.sums.data();
  std::vector<covariance_token>* candidates = buf.candidates.data();
  std::vector<std::uint64_t>* hits = buf.hits.data();
  const index_t* first = buf.chunk_first.data();
  be.for_each(static_cast<index_t>(chunks), [=, &be](index_t c) {
    std::vector<covariance_token>& out = candidates[c];
    std::vector<std::uint64_t>& h = hits[c];
    out.clear();
    for (index_t i = first[c]; i < first[c + 1]; ++i) {
      const index_t t0 = L.begin(i), e = L.end(i);
      if (e <= t0) {
        sums[i] = covariance_sums{};
        continue;
      }
      const double margin =
          (std::fabs(adv[i] - est.adv) * spread + bound * 0x1p-40) * (1 + 0x1p-40) + std::numeric_limits<double>::min();
      const double lo = (kl ? least : p.lb) - margin, hi = kl ? HUGE_VAL : p.ub + margin;
      const index_t blocks = (e - t0 + covariance_block - 1) / covariance_block;
      h.resize(static_cast<std::size_t>((blocks + 63) / 64));
      covariance_block_hits_fn<T> test{b, adv[i], lo, hi, est, t0, e, h.data()};
      if (!kl) {
        test.keyed = true;
        test.seed_bits = seed_bits;
        test.key_below = key_below;
        test.response = i;
        test.passed = &out;
      }
      be.for_each(1, covariance_response_fn<T>{test, sums + i, i});
      for (index_t w = 0; w * 64 < blocks; ++w)
        for (std::uint64_t bits = h[static_cast<std::size_t>(w)]; bits != 0; bits &= bits - 1) {
          const index_t t = t0 + (w * 64 + __builtin_ctzll(bits)) * covariance_block;
          for (index_t u = t, stop = std::min(t + covariance_block, e); u < stop; ++u) {
            if (!b.valid(u)) continue;
            const double logp = static_cast<double>(b.logp[u]);
            const double cov = token_covariance(adv[i], logp, est);
            bool in = cov > lo && cov <= hi;
            if (!kl) in = in && (splitmix64(seed_bits ^ subset_place(i, u - t0)) >> 11) < key_below;
            if (in) out.push_back({u, i, logp});
          }
        }
    }
  });
  covariance_means m;
  for (index_t i = 0; i < L.responses; ++i) covariance_add(m, sums[i], adv[i], false);
  covariance_finish(m);
  if (!(m.n == est.n && m.adv == est.adv && std::fabs(m.logp - est.logp) <= sample.spread)) return false;

  top_k_stream* streams = buf.streams.data();
  for (std::size_t c = 0; c < chunks; ++c) streams[c].reset(k, least);
  be.for_each(static_cast<index_t>(chunks), [=, &obj](index_t c) {
    top_k_stream& s = streams[c];
    for (const covariance_token& x : candidates[c])
      offer(obj, b, m, s, x.response, L.begin(x.response), x.t, adv[x.response], x.logp);
  });
  index_t pushed = 0;
  for (std::size_t c = 0; c < chunks; ++c) pushed += streams[c].pushed();
  if (pushed < k) return false;
  top_k_merge(buf.streams, chunks, k, buf.merged, selected);
  return true;
}

// One call's selection (no plan): the tokens one call on the whole batch selects, in increasing
// order, into `selected`; flags are not written. The responses run in chunks, each a stream of
// its own (in parallel on a parallel backend), and the streams merge into the k best of all: the
// same tokens whatever the chunks. A stream of C tokens admits about k (1 + ln(C / k)) of them,
// so the chunks are few (at most 16, of at least 2^16 tokens): with k a fixed share of N the
// share of tokens admitted then does not grow with N. From sampled_covariance_from tokens the
// streams start from covariance_least (`least`, where given: a test's bound), so that each admits
// about its share of the k best instead, and with the advantages per response the selection
// runs on a sampled mean first (covariance_select_sampled).
template <class Backend, class Obj, class T>
void covariance_select(const Backend& be, const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                       std::vector<index_t>& selected, double least = std::numeric_limits<double>::quiet_NaN()) {
  const token_layout& L = b.layout;
  selected.clear();
  covariance_buffers& buf = thread_covariance_buffers();
  buf.sums.resize(static_cast<std::size_t>(L.responses));
  const std::size_t chunks = covariance_chunks(L, buf.chunk_first);
  if (buf.streams.size() < chunks) buf.streams.resize(chunks);
  if (buf.hits.size() < chunks) buf.hits.resize(chunks);
  if (least != least && L.tokens >= sampled_covariance_from && b.token_advantages == nullptr &&
      covariance_select_sampled(be, obj, b, r, buf, chunks, selected))
    return;
  be.for_each(L.responses, covariance_sums_fn<T>{b, buf.sums.data()});
  covariance_means m;
  for (index_t i = 0; i < L.responses; ++i)
    covariance_add(m, buf.sums[static_cast<std::size_t>(i)], r.adv[i], b.token_advantages != nullptr);
  const index_t k = covariance_count(obj.select.params.ratio, m.n);
  if (k == 0) return;
  covariance_finish(m);
  top_k_stream* streams = buf.streams.data();
  std::vector<std::uint64_t>* hits = buf.hits.data();
  const index_t* first = buf.chunk_first.data();
  const double* adv = r.adv;
  if (least != least) {
    least = -HUGE_VAL;
    if (L.tokens >= sampled_covariance_from) {
      sample_covariance_tokens(b, buf.sample);
      least = covariance_least(obj, b, adv, m, k, buf.sample);
    }
  }
  auto run = [&](double from) {
    for (std::size_t c = 0; c < chunks; ++c) streams[c].reset(k, from);
    // (A chunk's block tests are passes of one call: they run on the chunk's thread.)
    be.for_each(static_cast<index_t>(chunks), [=, &be, &obj](index_t c) {
      covariance_stream(be, obj, b, adv, m, first[c], first[c + 1], streams[c], hits[c]);
    });
  };
  run(least);
  if (least > -HUGE_VAL) {
    // With k values at least `least` in all, the k best are among them (and each stream kept its
    // best k of them); with fewer, the bound was too high.
    index_t pushed = 0;
    for (std::size_t c = 0; c < chunks; ++c) pushed += streams[c].pushed();
    if (pushed < k) run(-HUGE_VAL);
  }
  top_k_merge(buf.streams, chunks, k, buf.merged, selected);
}

// The tokens of `flags` that are set, in increasing order.
inline void flagged_tokens(const std::uint8_t* flags, index_t n, std::vector<index_t>& out) {
  out.clear();
  for (index_t t = 0; t < n; ++t)
    if (flags[t]) out.push_back(t);
}

// Clip-Cov's kept counts per response: its valid tokens but the selected ones (the token pass
// takes the selected tokens themselves as its removed list, token_fn::removed).
inline void clip_cov_kept_counts(const token_layout& L, const std::vector<index_t>& selected, const index_t* length,
                                 index_t* kept_count) {
  std::size_t j = 0;
  for (index_t i = 0; i < L.responses; ++i) {
    index_t n = 0;
    for (; j < selected.size() && selected[j] < L.end(i); ++j) n += selected[j] >= L.begin(i);
    kept_count[i] = length[i] - n;
  }
}

// KL-Cov: + coef |logp - old_logp| on the selected tokens' policy term, with the policy term's
// scale (aggregation coefficient, response weight, token weight). The subgradient at 0 is 0.
template <class Obj, class T>
void covariance_penalty(const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                        const std::vector<index_t>& selected, T* grad_logp, token_partial& tokens) {
  const double coef = obj.select.params.coef;
  const token_layout& L = b.layout;
  double loss = 0;
  index_t i = 0;
  for (const index_t t : selected) {
    while (t >= L.end(i)) ++i;
    const double scale_i = r.coef_policy[i] * r.weight[i];
    const double d = b.old_logp ? static_cast<double>(b.logp[t]) - static_cast<double>(b.old_logp[t]) : 0.0;
    const double scale = b.token_weights ? scale_i * static_cast<double>(b.token_weights[t]) : scale_i;
    loss += scale * coef * std::fabs(d);
    const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
    grad_logp[t] = static_cast<T>(static_cast<double>(grad_logp[t]) + scale * coef * sign);
  }
  tokens.policy += loss;
}

}  // namespace detail
RECO_NAMESPACE_END
