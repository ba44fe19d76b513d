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

// parts' candidates instead).
struct covariance_buffers {
  std::vector<double> value;
  std::vector<double> keys;  // the candidates' values, for the order statistic
  std::vector<std::uint8_t> in;
  std::vector<covariance_sums> sums;  // per response
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
template <class Backend, class Obj, class T>
index_t covariance_select(const Backend& be, const Obj& obj, const batch_pointers<T>& b, const response_scratch& r,
                          std::uint8_t* flags) {
  const token_layout& L = b.layout;
  const index_t N = L.tokens;
  std::fill(flags, flags + N, std::uint8_t(0));
  covariance_buffers& buf = thread_covariance_buffers();
  buf.size_for(N);
  buf.sums.resize(static_cast<std::size_t>(L.responses));
  be.for_each(L.responses, covariance_sums_fn<T>{b, buf.sums.data()});
  covariance_means m;
  for (index_t i = 0; i < L.responses; ++i)
    covariance_add(m, buf.sums[static_cast<std::size_t>(i)], r.adv[i], b.token_advantages != nullptr);
  const index_t k = covariance_count(obj.select.params.ratio, m.n);
  if (k == 0) return 0;
  covariance_finish(m);
  covariance_values(obj, b, r.adv, m, 0, buf.value.data(), buf.in.data());
  const double* v = buf.value.data();
  const std::uint8_t* in = buf.in.data();
  // The candidates' values, contiguous: the backend's order statistic (O(n), it permutes them)
  // gives the take-th largest, the cut.
  buf.keys.resize(static_cast<std::size_t>(N));
  index_t n = 0;
  for (index_t t = 0; t < N; ++t) {
    buf.keys[static_cast<std::size_t>(n)] = v[t];
    n += in[t] != 0;
  }
  const index_t take = std::min(k, n);
  if (take == n) {
    for (index_t t = 0; t < N; ++t) flags[t] = in[t] != 0;
    return take;
  }
  const index_t rank = n - take;  // ascending rank of the take-th largest
  double cut = 0;
  be.order_statistics(buf.keys.data(), n, &rank, 1, &cut);
  // The values above the cut, then the earliest tokens on it until `take` are kept: the largest
  // values, the earlier token first on equal values.
  index_t above = 0;
  for (index_t t = 0; t < N; ++t) above += (in[t] != 0) & (v[t] > cut);
  index_t ties = take - above;
  for (index_t t = 0; t < N; ++t) {
    const bool on_cut = in[t] != 0 && v[t] == cut && ties > 0;
    ties -= on_cut;
    flags[t] = static_cast<std::uint8_t>((in[t] != 0 && v[t] > cut) || on_cut);
  }
  return take;
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
