// Independent reference implementation; see reco_ref.hpp. Source: docs/conventions.md (binding)
// and docs/concepts.md for the gradient check. Section names in the comments refer to the conventions page.
//
// Places where the definitions leave room carry a "READING:" comment with the choice made.

#include "reco_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace reco_ref {
namespace {

using i64 = std::int64_t;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("reco_ref: " + what);
}

std::size_t at(i64 index) { return static_cast<std::size_t>(index); }

// Compensated (Neumaier) sum. Used for the three loss parts only: the finite-difference checks
// divide a loss difference by 2h = 2e-6, so the loss must be accurate to about one ulp, and a
// plain running sum over a few hundred terms loses more than that.
class loss_sum {
 public:
  void add(double x) {
    const double t = s_ + x;
    if (std::fabs(s_) >= std::fabs(x)) {
      c_ += (s_ - t) + x;
    } else {
      c_ += (x - t) + s_;
    }
    s_ = t;
  }
  double value() const { return s_ + c_; }

 private:
  double s_ = 0, c_ = 0;
};

// In long double (x86: 64-bit mantissa, exponent range to 1e4932), so that rewards near the
// double range (1e200) neither overflow in the squares nor lose the all-equal group's exact mean.
double mean_of(const std::vector<double>& v) {
  if (v.empty()) return 0;
  long double s = 0;
  for (double x : v) s += x;
  return static_cast<double>(s / static_cast<long double>(v.size()));
}

// Unbiased (n - 1) standard deviation; 0 for fewer than two values.
double unbiased_std(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  long double m = 0;
  for (double x : v) m += x;
  m /= static_cast<long double>(v.size());
  long double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return static_cast<double>(std::sqrt(ss / static_cast<long double>(v.size() - 1)));
}

// x / d with 0 / 0 = 0 (an all-equal group or batch with eps = 0: its deviations are all 0).
double quotient(double x, double d) { return x == 0 && d == 0 ? 0.0 : x / d; }

// Linear-interpolation quantile: sorted ascending v, pos = q (n - 1),
// v[floor(pos)] + (pos - floor(pos)) (v[floor(pos) + 1] - v[floor(pos)]).
// READING: q outside [0, 1] (e.g. rho > 1 gives q = 1 - rho < 0) is clamped into [0, 1].
double linear_quantile(std::vector<double> v, double q) {
  require(!v.empty(), "quantile of an empty set");
  std::sort(v.begin(), v.end());
  q = std::min(std::max(q, 0.0), 1.0);
  const double pos = q * static_cast<double>(v.size() - 1);
  const double lo = std::floor(pos);
  const std::size_t k = static_cast<std::size_t>(lo);
  if (k + 1 >= v.size()) return v[v.size() - 1];
  return v[k] + (pos - lo) * (v[k + 1] - v[k]);
}

// ---------------------------------------------------------------------------------------------
// Batch layout: validity, |o_i|, groups.
// ---------------------------------------------------------------------------------------------

struct layout {
  i64 R = 0, N = 0, P = 0;
  std::vector<std::uint8_t> valid;  // per token: in its response's range and mask != 0
  std::vector<i64> length;          // per response: |o_i|
  std::vector<i64> group_of;        // per response
  std::vector<i64> group_size;      // per group: G_g, empty responses included
};

bool is_self_contained(ratio r) {
  return r == ratio::reinforce || r == ratio::cispo || r == ratio::sapo || r == ratio::vespo;
}

layout describe(const batch& b, const config& c) {
  layout lay;
  require(b.token_begin.size() == b.token_end.size(), "token_begin and token_end differ in size");
  require(b.num_tokens >= 0, "num_tokens < 0");
  lay.R = static_cast<i64>(b.token_begin.size());
  lay.N = b.num_tokens;
  const std::size_t N = at(lay.N), R = at(lay.R);

  require(b.logp.size() == N, "logp must have num_tokens entries");
  require(b.old_logp.size() == N, "old_logp must have num_tokens entries");
  require(b.ref_logp.empty() || b.ref_logp.size() == N, "ref_logp must be empty or have N entries");
  require(b.entropy.empty() || b.entropy.size() == N, "entropy must be empty or have N entries");
  require(b.mask.empty() || b.mask.size() == N, "mask must be empty or have N entries");
  require(b.token_weights.empty() || b.token_weights.size() == N,
          "token_weights must be empty or have N entries");
  require(b.token_advantages.empty() || (c.adv == advantage::given && b.advantages.empty() &&
                                          b.token_advantages.size() == N),
          "token_advantages: N entries, with advantage::given and without batch.advantages");
  if (c.adv == advantage::given && !b.token_advantages.empty()) {
    require(b.rewards.empty() || b.rewards.size() == R, "rewards must be empty or have R entries");
  } else if (c.adv == advantage::given) {
    require(b.advantages.size() == R, "advantage::given needs batch.advantages (R entries)");
    require(b.rewards.empty() || b.rewards.size() == R, "rewards must be empty or have R entries");
  } else {
    require(b.rewards.size() == R, "rewards must have R entries");
  }
  if (c.weight_mode == weight::caller) {
    require(b.response_weights.size() == R, "weight::caller needs batch.response_weights");
  }
  if (c.kl_mode != kl::none) require(b.ref_logp.size() == N, "a KL term needs batch.ref_logp");
  if (c.entropy_bonus) require(b.entropy.size() == N, "the entropy bonus needs batch.entropy");
  if (c.select == selection::top_k || c.select == selection::quantile)
    require(b.entropy.size() == N, "token selection needs batch.entropy");
  if (c.clip_mode == clip::entropy_split) {
    require(b.entropy.size() == N, "entropy_split clipping needs batch.entropy");
  }
  // READING: the conventions say the self-contained surrogates "must be composed with no_clip";
  // the reference refuses any other clip mode instead of guessing what it would mean.
  if (is_self_contained(c.ratio_form)) {
    require(c.clip_mode == clip::none, "reinforce / cispo / sapo / vespo ratios must use clip::none");
  }

  require(!b.group_offsets.empty(), "group_offsets needs P + 1 entries");
  require(b.group_offsets.front() == 0, "group_offsets must start at 0");
  require(b.group_offsets.back() == lay.R, "group_offsets must end at R");
  lay.P = static_cast<i64>(b.group_offsets.size()) - 1;
  lay.group_of.assign(R, -1);
  lay.group_size.assign(at(lay.P), 0);
  for (i64 g = 0; g < lay.P; ++g) {
    const i64 first = b.group_offsets[at(g)], last = b.group_offsets[at(g + 1)];
    require(first <= last, "group_offsets must be non-decreasing");
    lay.group_size[at(g)] = last - first;
    for (i64 i = first; i < last; ++i) lay.group_of[at(i)] = g;
  }

  lay.valid.assign(N, 0);
  lay.length.assign(R, 0);
  std::vector<std::uint8_t> owned(N, 0);
  for (i64 i = 0; i < lay.R; ++i) {
    const i64 begin = b.token_begin[at(i)], end = b.token_end[at(i)];
    require(0 <= begin && begin <= end && end <= lay.N, "token range outside [0, num_tokens]");
    for (i64 t = begin; t < end; ++t) {
      require(owned[at(t)] == 0, "token ranges overlap");
      owned[at(t)] = 1;
      const bool valid = b.mask.empty() || b.mask[at(t)] != 0;
      if (valid) {
        lay.valid[at(t)] = 1;
        lay.length[at(i)] += 1;
      }
    }
  }
  return lay;
}

// ---------------------------------------------------------------------------------------------
// Advantages (conventions "Advantages"). A group stage per group, then a batch stage for the
// estimators that have one (batch_std, reinforce_pp, gpg).
// ---------------------------------------------------------------------------------------------

// The group-stage value of a singleton group's response.
double singleton_value(double s, bool divides_by_std, const config& c) {
  if (c.singleton_policy == singleton::zero) return 0;
  return divides_by_std ? s / (1 + c.adv_eps) : s;
}

std::vector<double> group_rewards(const batch& b, i64 g) {
  return std::vector<double>(b.rewards.begin() + b.group_offsets[at(g)],
                             b.rewards.begin() + b.group_offsets[at(g + 1)]);
}

std::vector<double> advantages_of(const batch& b, const config& c, const layout& lay) {
  if (c.adv == advantage::given && !b.token_advantages.empty()) {
    // Per token: the response's value is their mean over its valid tokens (reported only).
    std::vector<double> A(at(lay.R), 0.0);
    for (i64 i = 0; i < lay.R; ++i) {
      double s = 0, n = 0;
      for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t)
        if (lay.valid[at(t)]) {
          s += b.token_advantages[at(t)];
          n += 1;
        }
      A[at(i)] = n > 0 ? s / n : 0.0;
    }
    return A;
  }
  if (c.adv == advantage::given) return b.advantages;

  // Group stage.
  std::vector<double> a(at(lay.R), 0.0);
  for (i64 g = 0; g < lay.P; ++g) {
    const i64 first = b.group_offsets[at(g)], last = b.group_offsets[at(g + 1)];
    const i64 G = last - first;
    if (G == 0) continue;
    const std::vector<double> s = group_rewards(b, g);
    const double mean = mean_of(s);
    const double sd = unbiased_std(s);

    if (G == 1) {
      const bool divides = (c.adv == advantage::grpo || c.adv == advantage::pass_at_k) && c.scale_by_std;
      a[at(first)] = singleton_value(b.rewards[at(first)], divides, c);
      continue;
    }

    switch (c.adv) {
      case advantage::grpo:
        for (i64 i = first; i < last; ++i) {
          const double si = b.rewards[at(i)];
          a[at(i)] = c.scale_by_std ? quotient(si - mean, sd + c.adv_eps) : si - mean;
        }
        break;
      case advantage::dr_grpo:
      case advantage::batch_std:     // divided by the batch std below
      case advantage::reinforce_pp:  // whitened below
      case advantage::gpg:           // scaled by alpha below
        for (i64 i = first; i < last; ++i) a[at(i)] = b.rewards[at(i)] - mean;
        break;
      case advantage::rloo:
        for (i64 i = first; i < last; ++i) {
          a[at(i)] = static_cast<double>(G) / static_cast<double>(G - 1) * (b.rewards[at(i)] - mean);
        }
        break;
      case advantage::opo: {
        // Length-weighted baseline; the plain mean when the group has no valid token.
        double num = 0, den = 0;
        for (i64 i = first; i < last; ++i) {
          num += static_cast<double>(lay.length[at(i)]) * b.rewards[at(i)];
          den += static_cast<double>(lay.length[at(i)]);
        }
        const double baseline = den > 0 ? num / den : mean;
        for (i64 i = first; i < last; ++i) a[at(i)] = b.rewards[at(i)] - baseline;
        break;
      }
      case advantage::pass_at_k: {
        i64 best = first;  // first index of the maximum reward
        for (i64 i = first + 1; i < last; ++i) {
          if (b.rewards[at(i)] > b.rewards[at(best)]) best = i;
        }
        bool have_second = false;
        double second = 0;  // maximum of the others
        for (i64 i = first; i < last; ++i) {
          if (i == best) continue;
          if (!have_second || b.rewards[at(i)] > second) second = b.rewards[at(i)];
          have_second = true;
        }
        for (i64 i = first; i < last; ++i) a[at(i)] = 0;
        const double gap = b.rewards[at(best)] - second;
        a[at(best)] = c.scale_by_std ? quotient(gap, sd + c.adv_eps) : gap;
        break;
      }
      case advantage::given:
        break;
    }
  }

  // Batch stage.
  std::vector<double> A = a;
  switch (c.adv) {
    case advantage::batch_std: {
      // READING: the singleton's group-stage value (0, or s_i under raw_score) is divided by the
      // batch std like every other response's s_i - mean_g (verl's mean 0 / std 1 substitution
      // replaces the group std only, and batch_std does not use the group std).
      const double sd_batch = unbiased_std(b.rewards);
      for (i64 i = 0; i < lay.R; ++i) A[at(i)] = quotient(a[at(i)], sd_batch + c.adv_eps);
      break;
    }
    case advantage::reinforce_pp: {
      // Whitening over all valid tokens of the batch (each token carries a_i).
      double tokens = 0, weighted = 0;
      for (i64 i = 0; i < lay.R; ++i) {
        tokens += static_cast<double>(lay.length[at(i)]);
        weighted += static_cast<double>(lay.length[at(i)]) * a[at(i)];
      }
      // READING: with no valid token at all, mu = 0 (the definition divides 0 by 0).
      const double mu = tokens > 0 ? weighted / tokens : 0;
      double ss = 0;
      for (i64 i = 0; i < lay.R; ++i) {
        ss += static_cast<double>(lay.length[at(i)]) * (a[at(i)] - mu) * (a[at(i)] - mu);
      }
      const double divisor = c.whiten_unbiased ? tokens - 1 : tokens;
      const double var = divisor > 0 ? ss / divisor : 0;
      for (i64 i = 0; i < lay.R; ++i) A[at(i)] = quotient(a[at(i)] - mu, std::sqrt(var + c.whiten_eps));
      break;
    }
    case advantage::gpg: {
      i64 nonzero = 0;
      for (double s : b.rewards) nonzero += (s != 0) ? 1 : 0;
      const double alpha = static_cast<double>(lay.R) / static_cast<double>(std::max<i64>(nonzero, 1));
      for (i64 i = 0; i < lay.R; ++i) A[at(i)] = alpha * a[at(i)];
      break;
    }
    default:
      break;
  }
  return A;
}

// Groups whose rewards are all equal (singletons included) / P; 0 for `given`.
// READING: an empty group (two equal offsets) counts as all-equal (vacuously true).
double zero_std_group_frac_of(const batch& b, const config& c, const layout& lay) {
  if (c.adv == advantage::given || lay.P == 0) return 0;
  i64 equal = 0;
  for (i64 g = 0; g < lay.P; ++g) {
    const std::vector<double> s = group_rewards(b, g);
    bool all_equal = true;
    for (double x : s) all_equal = all_equal && (x == s.front());
    equal += all_equal ? 1 : 0;
  }
  return static_cast<double>(equal) / static_cast<double>(lay.P);
}

// ---------------------------------------------------------------------------------------------
// Response weights (conventions "Response weights").
// ---------------------------------------------------------------------------------------------

std::vector<double> weights_of(const batch& b, const config& c, const layout& lay, i64& cap_hits) {
  cap_hits = 0;
  // READING: uniform weights are 1 for every response (empty ones too) and are neither capped
  // nor normalised; cap and normalisation are described for expected_count and caller only.
  if (c.weight_mode == weight::uniform) return std::vector<double>(at(lay.R), 1.0);

  // In long double (exponent range to 1e4932), so that a weight beyond the double range (mean
  // old_logp below about -709) still normalises to the definition's value.
  std::vector<long double> w(at(lay.R), 1.0L);
  for (i64 i = 0; i < lay.R; ++i) {
    if (lay.length[at(i)] == 0) {
      w[at(i)] = 0;
      continue;
    }
    if (c.weight_mode == weight::expected_count) {
      // log w = -log G_g - mean_t old_logp over the valid tokens of i.
      long double sum_old = 0;
      for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t) {
        if (lay.valid[at(t)]) sum_old += b.old_logp[at(t)];
      }
      const long double mean_old = sum_old / static_cast<long double>(lay.length[at(i)]);
      const long double G = static_cast<long double>(lay.group_size[at(lay.group_of[at(i)])]);
      w[at(i)] = std::exp(-std::log(G) - mean_old);
    } else {
      // READING: caller weights share config.weight_cap (default 10) with expected_count.
      w[at(i)] = b.response_weights[at(i)];
    }
    if (c.weight_cap > 0 && w[at(i)] > c.weight_cap) {
      w[at(i)] = c.weight_cap;
      cap_hits += 1;
    }
  }

  // Normalisation to mean 1 over the non-empty responses of a group / of the batch.
  auto normalise = [&](i64 first, i64 last) {
    long double sum = 0;
    i64 n = 0;
    for (i64 i = first; i < last; ++i) {
      if (lay.length[at(i)] == 0) continue;
      sum += w[at(i)];
      n += 1;
    }
    if (sum == 0) return;
    for (i64 i = first; i < last; ++i) w[at(i)] = w[at(i)] * static_cast<long double>(n) / sum;  // empty stay 0
  };
  if (c.weight_normalisation == weight_norm::group_mean) {
    for (i64 g = 0; g < lay.P; ++g) normalise(b.group_offsets[at(g)], b.group_offsets[at(g + 1)]);
  } else if (c.weight_normalisation == weight_norm::batch_mean) {
    normalise(0, lay.R);
  }
  std::vector<double> out(at(lay.R));
  for (i64 i = 0; i < lay.R; ++i) {
    out[at(i)] = static_cast<double>(w[at(i)]);
    require(std::isfinite(out[at(i)]), "response weight " + std::to_string(i) + " beyond the double range");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Token selection (conventions "Token selection"): 1 = policy token.
// ---------------------------------------------------------------------------------------------

std::vector<std::uint8_t> kept_of(const batch& b, const config& c, const layout& lay) {
  std::vector<std::uint8_t> kept = lay.valid;
  if (c.select == selection::all || c.select == selection::cov_clip || c.select == selection::cov_kl) return kept;

  // Population: the valid tokens, in flat position order.
  std::vector<i64> population;
  for (i64 t = 0; t < lay.N; ++t) {
    if (lay.valid[at(t)]) population.push_back(t);
  }
  std::fill(kept.begin(), kept.end(), 0);
  const i64 n = static_cast<i64>(population.size());

  if (c.select == selection::top_k) {
    double value = 0;
    i64 ties_to_keep = 0;  // < 0: every tie
    if (c.use_given_cut) {
      // READING: a caller's cut keeps H > cut plus the first `given_ties` tokens with H == cut
      // in position order (all of them when given_ties < 0).
      value = c.given_cut;
      ties_to_keep = c.given_ties;
    } else {
      if (n == 0) return kept;
      i64 k = std::max<i64>(1, static_cast<i64>(std::ceil(c.rho * static_cast<double>(n) * (1 - 1e-12))));
      k = std::min(k, n);  // READING: rho > 1 keeps every token
      std::vector<double> h;
      for (i64 t : population) h.push_back(b.entropy[at(t)]);
      std::sort(h.begin(), h.end(), [](double x, double y) { return x > y; });
      value = h[at(k - 1)];  // the k-th largest entropy
      i64 above = 0;
      for (i64 t : population) above += (b.entropy[at(t)] > value) ? 1 : 0;
      ties_to_keep = k - above;
    }
    i64 ties_kept = 0;
    for (i64 t : population) {
      const double H = b.entropy[at(t)];
      if (H > value) {
        kept[at(t)] = 1;
      } else if (H == value && (ties_to_keep < 0 || ties_kept < ties_to_keep)) {
        kept[at(t)] = 1;
        ties_kept += 1;
      }
    }
    return kept;
  }

  // quantile: keep H >= the (1 - rho) linear-interpolation quantile (ties kept).
  double value = 0;
  if (c.use_given_cut) {
    value = c.given_cut;  // READING: given_ties is not used by the quantile rule
  } else {
    if (n == 0) return kept;
    std::vector<double> h;
    for (i64 t : population) h.push_back(b.entropy[at(t)]);
    value = linear_quantile(h, 1 - c.rho);
  }
  for (i64 t : population) {
    if (b.entropy[at(t)] >= value) kept[at(t)] = 1;
  }
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Ratio forms and clipping for one token (conventions "Ratio forms", "Clipping").
// ---------------------------------------------------------------------------------------------

// clamp(l, -L, L); L <= 0 disables. `inside` tells whether -L <= l <= L.
double clamp_log(double l, double L, bool& inside) {
  if (L <= 0) {
    inside = true;
    return l;
  }
  inside = (-L <= l && l <= L);
  return std::min(std::max(l, -L), L);
}

// logV(q) = max(q + log(-expm1(q)), log floor): log of p (1 - p) for p = exp(q), with
// 1 - p = -expm1(q) so that p -> 1 keeps its precision; log(0) = -inf (and NaN) is floored too.
double log_variance(double q, double floor_value, bool& floored) {
  const double v = q + std::log(-std::expm1(q));
  const double lf = std::log(floor_value);
  floored = !(v > lf);
  return floored ? lf : v;
}

double sign_of(double A) { return A > 0 ? 1.0 : (A < 0 ? -1.0 : 0.0); }

// GMPO's sign-aware log-space clip: m = sgn(A) min(sgn(A) l, sgn(A) clamp(l, -eps_low, eps_high)).
double gmpo_log(double l, double A, const config& c) {
  const double s = sign_of(A);
  const double clamped = std::min(std::max(l, -c.gmpo_eps_low), c.gmpo_eps_high);
  return s * std::min(s * l, s * clamped);
}

bool gmpo_unclipped(double l, double A, const config& c) {
  if (A > 0) return l <= c.gmpo_eps_high;
  if (A < 0) return l >= -c.gmpo_eps_low;
  return true;
}

struct token_in {
  double A = 0;         // the response's advantage
  double lp = 0;        // logp: the variable
  double fz = 0;        // logp at which stop-gradient quantities are evaluated
  double old = 0;       // old_logp
  double seq_log = 0;   // GSPO: mean of (fz - old) over the response; GMPO: mean of m(fz - old);
                        // VESPO: sum of clamp(fz - old, -20, 20)
  double eps_low = 0;   // this token's clip range (entropy_split may widen it)
  double eps_high = 0;
};

struct token_out {
  double loss = 0;   // l_t
  double grad = 0;   // d l_t / d logp_t
  double shown = 0;  // the ratio reported in the diagnostics
  bool clipped = false, dual = false;
};

token_out policy_token(const config& c, const token_in& in) {
  token_out out;
  const double A = in.A;
  const double L = c.log_ratio_clamp;
  bool r_inside = true;
  const double r = std::exp(clamp_log(in.lp - in.old, L, r_inside));  // clamped token ratio

  // Self-contained surrogates (no clip; the diagnostics show r).
  if (c.ratio_form == ratio::reinforce) {
    out.shown = r;
    out.loss = -A * in.lp;
    out.grad = -A;
    return out;
  }
  if (c.ratio_form == ratio::dppo) {
    // The truncated ratio and the region at the frozen point (both detached).
    bool unused = true;
    const double r_frozen = std::exp(clamp_log(in.fz - in.old, L, unused));
    const double w_hat = std::min(r_frozen, c.dppo_c);
    const double p = std::exp(in.fz), p_old = std::exp(in.old);
    bool inside;
    if (!c.dppo_binary_kl) {
      inside = A > 0 ? p - p_old <= c.dppo_eps_high : p - p_old >= -c.dppo_eps_low;
    } else {
      const double d = p_old * (in.old - in.fz) + (1 - p_old) * std::log((1 - p_old + 1e-8) / (1 - p + 1e-8));
      inside = A > 0 ? (d <= c.dppo_eps_high || p <= p_old) : (d <= c.dppo_eps_low || p >= p_old);
    }
    out.shown = r;
    out.loss = inside ? -w_hat * A * in.lp : 0.0;
    out.grad = inside ? -w_hat * A : 0.0;
    out.clipped = !inside && A != 0;
    return out;
  }
  if (c.ratio_form == ratio::cispo) {
    bool unused = true;
    const double r_frozen = std::exp(clamp_log(in.fz - in.old, L, unused));
    const double lo = 1 - c.cispo_eps_low, hi = 1 + c.cispo_eps_high;
    const double w_hat = std::min(std::max(r_frozen, lo), hi);  // sg(clip(r, lo, hi))
    out.shown = r;
    out.loss = -w_hat * A * in.lp;
    out.grad = -A * w_hat;
    out.clipped = (r_frozen < lo || r_frozen > hi) && A != 0;
    return out;
  }
  if (c.ratio_form == ratio::vespo) {
    // TRL get_gamma_weights: log w clamped to [log 1e-8, 20]; phi detached (frozen point).
    const double log_w = std::min(std::max(in.seq_log, std::log(1e-8)), 20.0);
    const double w = std::exp(log_w);
    const double k = A >= 0 ? c.vespo_k_pos : c.vespo_k_neg;
    const double lam = A >= 0 ? c.vespo_lambda_pos : c.vespo_lambda_neg;
    const double phi = std::exp(lam) * std::pow(w, k) * std::exp(-lam * w);
    out.shown = w;
    out.loss = -phi * A * in.lp;
    out.grad = -phi * A;
    return out;
  }
  if (c.ratio_form == ratio::sapo) {
    const double tau = A > 0 ? c.sapo_tau_pos : c.sapo_tau_neg;
    const double sigma = 1 / (1 + std::exp(-tau * (r - 1)));
    out.shown = r;
    out.loss = -sigma * (4 / tau) * A;
    // A = 0 contributes 0 even where an unclamped r overflows (0 * inf).
    out.grad = r_inside && A != 0 ? -4 * A * sigma * (1 - sigma) * r : 0;
    return out;
  }

  // Clip-based forms: the value x the clip sees, the gradient weight omega = dx/dlogp,
  // whether the surrogate's value is reciprocal, whether the form itself marks the token clipped.
  double x = 0, omega = 0, x_frozen = 1;
  bool reciprocal = false, marked = false;
  switch (c.ratio_form) {
    case ratio::token:
      x = r;
      omega = r_inside ? r : 0;
      break;
    case ratio::sequence:
      // exp(sg(s) + logp - sg(logp)) with the log value capped at seq_max_log.
      // READING: seq_max_log is always applied (the "0 disables" rule is stated for L only).
      if (in.seq_log <= c.seq_max_log) {
        x = std::exp(in.seq_log + in.lp - in.fz);
        omega = x;
      } else {
        x = std::exp(c.seq_max_log);
        omega = 0;
      }
      break;
    case ratio::variance: {
      // p (1 - sg p) / (p_old (1 - p_old)) in log space: logp + log(1 - p_frozen) - logV(old).
      // READING: where the floor decides logV at the frozen point the numerator is the floor (a
      // constant), yet omega = x as the conventions state; random test data never gets there.
      bool floored_f = false, floored_old = false;
      const double logv_frozen = log_variance(in.fz, c.variance_floor, floored_f);
      const double logv_old = log_variance(in.old, c.variance_floor, floored_old);
      const double numerator = floored_f ? logv_frozen : in.lp + std::log(-std::expm1(in.fz));
      bool inside = true;
      x = std::exp(clamp_log(numerator - logv_old, L, inside));
      omega = inside ? x : 0;
      break;
    }
    case ratio::flipped:
    case ratio::flipped_all:
      if (c.ratio_form == ratio::flipped_all || A > 0) {
        // Value -A rho / sg(rho)^2 = -A / rho; gradient weight 1 / r.
        reciprocal = true;
        bool unused = true;
        x_frozen = std::exp(clamp_log(in.fz - in.old, L, unused));
        x = r;
        omega = r_inside ? r / (x_frozen * x_frozen) : 0;
      } else {
        x = r;
        omega = r_inside ? r : 0;
      }
      break;
    case ratio::gmpo: {
      // exp(sg(mean m) + m_t - sg(m_t)): every token of the response shares the value.
      const double m_live = gmpo_log(in.lp - in.old, A, c);
      const double m_frozen = gmpo_log(in.fz - in.old, A, c);
      x = std::exp(in.seq_log + m_live - m_frozen);
      marked = !gmpo_unclipped(in.lp - in.old, A, c);
      omega = marked ? 0 : x;
      break;
    }
    case ratio::reinforce:
    case ratio::cispo:
    case ratio::sapo:
    case ratio::vespo:
    case ratio::dppo:
      break;  // handled above
  }
  out.shown = x;
  if (A == 0) return out;  // never clipped; loss and gradient 0

  // READING: a token the ratio form marks (GMPO) counts as clipped under every clip mode; its
  // value stays -A x (rho = x) and its gradient is 0.
  double rho = x;
  bool clipped = marked, ppo_clipped = false, capped = false;
  if (c.clip_mode != clip::none) {
    if (A > 0 && x > 1 + in.eps_high) {
      ppo_clipped = true;
      rho = 1 + in.eps_high;
    } else if (A < 0 && x < 1 - in.eps_low) {
      ppo_clipped = true;
      rho = 1 - in.eps_low;
    }
    if (c.delta > 0) {
      // TRL: -min(A min(x, delta), A clamp(x, 1 - eps_low, 1 + eps_high)), i.e. the smaller of
      // the two ratios for A > 0 and the larger for A < 0. The gradient flows only where the
      // chosen ratio is x itself; where the delta branch decides, the token counts as capped.
      const double a = std::min(x, c.delta);
      const double b = std::min(std::max(x, 1 - in.eps_low), 1 + in.eps_high);
      const double chosen = A > 0 ? std::min(a, b) : std::max(a, b);
      capped = chosen != x && !ppo_clipped;
      rho = chosen;
    }
  }
  clipped = clipped || ppo_clipped;
  double S = rho;
  if (reciprocal) S = (ppo_clipped || capped) ? 1 / rho : rho / (x_frozen * x_frozen);

  out.loss = -A * S;
  out.grad = (clipped || capped) ? 0 : -A * omega;
  out.clipped = clipped;
  out.dual = capped;

  // READING: the dual clip is part of ppo_clip (and entropy_split, "as ppo_clip"); with
  // clip::none the dual mode is ignored.
  if (c.clip_mode != clip::none) {
    if (c.dual_mode == dual::hard && A < 0 && out.loss > -A * c.dual_c) {
      out.loss = -A * c.dual_c;
      out.grad = 0;
      out.dual = true;
    } else if (c.dual_mode == dual::soft && !clipped && !capped && (reciprocal ? 1 / x : x) > c.dual_c) {
      // The ratio itself (1/rho for the reciprocal surrogate) is compared with c, also where the
      // log-ratio clamp has set omega to 0.
      out.loss = -A * c.dual_c * in.lp;  // -A sg(c) logp
      out.grad = -A * c.dual_c;
      out.dual = true;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// KL estimators (conventions "The loss"), d = logp - ref_logp.
// ---------------------------------------------------------------------------------------------

struct kl_out {
  double value = 0, grad = 0;
};

// Value and gradient of the chosen estimator at d. Straight-through: the value of the estimator
// and the gradient of k2, i.e. the term sg(k(d) - d^2/2) + d^2/2; `d_frozen` is where its
// stop-gradient part is evaluated (d_frozen == d outside frozen_loss).
kl_out kl_estimator(const config& c, double d) {
  kl_out k;
  switch (c.kl_mode) {
    case kl::none:
      return k;
    case kl::k1:
      k.value = d;
      k.grad = 1;
      break;
    case kl::abs:
      k.value = std::fabs(d);
      k.grad = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
      break;
    case kl::k2:
      k.value = d * d / 2;
      k.grad = d;
      break;
    case kl::k3: {
      // e = -d; k = e^e - e - 1 = expm1(e) - e; k' = 1 - e^e = -expm1(e).
      double e = -d;
      bool bites = false;
      if (c.kl_clamp && (e < -20 || e > 20)) {
        e = std::min(std::max(e, -20.0), 20.0);
        bites = true;
      }
      double value = std::expm1(e) - e;
      if (c.kl_clamp && (value < -10 || value > 10)) {
        value = std::min(std::max(value, -10.0), 10.0);
        bites = true;
      }
      k.value = value;
      k.grad = bites ? 0 : -std::expm1(e);
      break;
    }
  }
  return k;
}

kl_out kl_term(const config& c, double d, double d_frozen) {
  if (!c.kl_straight_through) return kl_estimator(c, d);
  kl_out k;
  k.value = kl_estimator(c, d_frozen).value + (d * d - d_frozen * d_frozen) / 2;
  k.grad = d;
  return k;
}

// ---------------------------------------------------------------------------------------------
// Aggregation coefficients (conventions "Aggregation").
// ---------------------------------------------------------------------------------------------

struct term_counts {
  std::vector<i64> per_response;  // n_i
  i64 responses = 0;              // R' = #{i : n_i > 0}
  i64 tokens = 0;                 // N = sum n_i
};

term_counts count_flags(const batch& b, const layout& lay, const std::vector<std::uint8_t>& flag) {
  term_counts k;
  k.per_response.assign(at(lay.R), 0);
  for (i64 i = 0; i < lay.R; ++i) {
    for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t) {
      if (flag[at(t)]) k.per_response[at(i)] += 1;
    }
    if (k.per_response[at(i)] > 0) k.responses += 1;
    k.tokens += k.per_response[at(i)];
  }
  return k;
}

double coefficient(const config& c, const batch& b, const layout& lay, const term_counts& k,
                   i64 global_tokens, i64 global_responses, i64 i) {
  const double N = static_cast<double>(global_tokens > 0 ? global_tokens : k.tokens);
  const double Rp = static_cast<double>(global_responses > 0 ? global_responses : k.responses);
  double divisor = 0;
  switch (c.agg) {
    case aggregation::token_mean:
      divisor = N;
      break;
    case aggregation::seq_mean_token_mean:
      divisor = Rp * static_cast<double>(k.per_response[at(i)]);
      break;
    case aggregation::seq_mean_token_sum:
      divisor = Rp;
      break;
    case aggregation::seq_mean_token_sum_all:
      // LUSPO (TRL): (per-response token sums).mean() over the local batch, empty responses
      // included. READING: always the local R, as for seq_mean_token_sum_norm.
      divisor = static_cast<double>(lay.R);
      break;
    case aggregation::seq_mean_token_sum_norm: {
      // C = constant, or R * L_max. READING: R is the local number of responses (all of them,
      // empty ones included); the global normalisers replace N and R' only.
      if (c.sum_norm_constant > 0) {
        divisor = c.sum_norm_constant;
      } else {
        const double L_max = c.sum_norm_max_length > 0 ? c.sum_norm_max_length
                                                        : static_cast<double>(b.max_length);
        divisor = static_cast<double>(lay.R) * L_max;
      }
      break;
    }
  }
  return divisor != 0 ? 1 / divisor : 0;  // a zero divisor makes the coefficient 0
}

// ---------------------------------------------------------------------------------------------
// Clip-Cov / KL-Cov selection: 1 = selected. Everything at the frozen point (stop-gradient).
// ---------------------------------------------------------------------------------------------

std::uint64_t mix64(std::uint64_t z) {  // splitmix64's output function of state z
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<std::uint8_t> cov_selected_of(const batch& b, const config& c, const layout& lay,
                                          const std::vector<double>& adv, const std::vector<double>& frozen) {
  std::vector<std::uint8_t> sel(at(lay.N), 0);
  if (c.select != selection::cov_clip && c.select != selection::cov_kl) return sel;
  // The sums per response (tokens in position order), then over the responses in order.
  double n = 0, sa = 0, sl = 0;
  for (i64 i = 0; i < lay.R; ++i) {
    double ni = 0, ai = 0, li = 0;
    for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t)
      if (lay.valid[at(t)]) {
        ni += 1;
        if (!b.token_advantages.empty()) ai += b.token_advantages[at(t)];
        li += frozen[at(t)];
      }
    n += ni;
    sa += b.token_advantages.empty() ? ni * adv[at(i)] : ai;
    sl += li;
  }
  if (n == 0) return sel;
  const double ma = sa / n, ml = sl / n;
  const i64 k = std::max<i64>(1, static_cast<i64>(c.cov_ratio * n));
  struct cand {
    double cov;
    std::uint64_t key;
    i64 t;
  };
  std::vector<cand> cs;
  for (i64 i = 0; i < lay.R; ++i)
    for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t) {
      if (!lay.valid[at(t)]) continue;
      const double A = b.token_advantages.empty() ? adv[at(i)] : b.token_advantages[at(t)];
      const double cov = (A - ma) * (frozen[at(t)] - ml);
      if (c.select == selection::cov_clip) {
        bool unused = true;
        const double r = std::exp(clamp_log(frozen[at(t)] - b.old_logp[at(t)], c.log_ratio_clamp, unused));
        bool clip_binds = false;
        if (c.clip_mode == clip::ppo) {
          const double rc = std::min(std::max(r, 1 - c.eps_low), 1 + c.eps_high);
          clip_binds = -A * rc > -A * r;
        }
        if (clip_binds || !(cov > c.cov_lb) || !(cov < c.cov_ub)) continue;
        std::uint64_t seed_bits = 0;
        std::memcpy(&seed_bits, &c.cov_seed, sizeof seed_bits);
        // The token's place: its response and its position in the response's token range.
        const std::uint64_t place = (static_cast<std::uint64_t>(i) << 32) ^
                                    static_cast<std::uint64_t>(t - b.token_begin[at(i)]);
        const std::uint64_t key = mix64((seed_bits * 0xD1B54A32D192ED03ull) ^ place) >> 11;
        cs.push_back({cov, key, t});
      } else {
        cs.push_back({cov, 0, t});
      }
    }
  // A full sort: clip by the seeded key, kl by covariance (larger first); the earlier token on ties.
  if (c.select == selection::cov_clip)
    std::sort(cs.begin(), cs.end(), [](const cand& x, const cand& y) { return x.key < y.key || (x.key == y.key && x.t < y.t); });
  else
    std::sort(cs.begin(), cs.end(), [](const cand& x, const cand& y) { return x.cov > y.cov || (x.cov == y.cov && x.t < y.t); });
  for (std::size_t j = 0; j < cs.size() && static_cast<i64>(j) < k; ++j) sel[at(cs[j].t)] = 1;
  return sel;
}

// ---------------------------------------------------------------------------------------------
// The whole evaluation. `logp` is the variable, `frozen` the point of the stop-gradient terms.
// ---------------------------------------------------------------------------------------------

output compute(const batch& b, const config& c, const std::vector<double>& logp,
               const std::vector<double>& frozen) {
  const layout lay = describe(b, c);
  require(logp.size() == at(lay.N) && frozen.size() == at(lay.N), "logp vectors must have N entries");
  const std::size_t N = at(lay.N);

  output out;
  out.advantages = advantages_of(b, c, lay);
  out.zero_std_group_frac = zero_std_group_frac_of(b, c, lay);
  out.weights = weights_of(b, c, lay, out.weight_cap_hits);
  out.kept = kept_of(b, c, lay);
  const std::vector<std::uint8_t> cov_sel = cov_selected_of(b, c, lay, out.advantages, frozen);
  if (c.select == selection::cov_clip)  // Clip-Cov: the selected tokens leave the policy term
    for (std::size_t t = 0; t < N; ++t) out.kept[t] = out.kept[t] && !cov_sel[t];
  out.grad_logp.assign(N, 0.0);
  out.grad_entropy.assign(N, 0.0);

  // Counts: the KL and entropy terms use the valid counts; the policy term the valid counts
  // (denominator valid) or the kept counts (denominator kept).
  const term_counts valid_counts = count_flags(b, lay, lay.valid);
  const term_counts kept_counts = count_flags(b, lay, out.kept);
  const bool kept_denominator = c.denom == denominator::kept;
  const term_counts& pg_counts = kept_denominator ? kept_counts : valid_counts;
  const i64 pg_global_tokens = kept_denominator ? c.norm_kept_tokens : c.norm_tokens;
  const i64 pg_global_responses = kept_denominator ? c.norm_kept_responses : c.norm_responses;

  loss_sum policy, kl_total, entropy_total;

  // Diagnostic accumulators.
  double n_policy = 0, n_clipped = 0, n_low = 0, n_high = 0, n_dual = 0, sum_ppo_kl = 0;
  double sum_ratio = 0, min_ratio = 0, max_ratio = 0, sum_entropy_kept = 0;
  double n_valid = 0, sum_ref_kl = 0, sum_entropy = 0, sum_adv = 0;
  double sum_var[3] = {0, 0, 0}, n_var[3] = {0, 0, 0};

  for (i64 i = 0; i < lay.R; ++i) {
    const i64 begin = b.token_begin[at(i)], end = b.token_end[at(i)];
    if (lay.length[at(i)] == 0) continue;
    const double A_i = out.advantages[at(i)];
    // The advantage of token t: A_i, or A_t when given per token.
    auto adv_at = [&](i64 t) { return b.token_advantages.empty() ? A_i : b.token_advantages[at(t)]; };
    const double w = out.weights[at(i)];
    const double n_i = static_cast<double>(lay.length[at(i)]);

    // Per-response quantities: the sequence values at the frozen point, the entropy-split
    // threshold, and the first / last valid positions.
    double seq_log = 0;
    if (c.ratio_form == ratio::sequence || c.ratio_form == ratio::gmpo) {
      double s = 0;
      for (i64 t = begin; t < end; ++t) {
        if (!lay.valid[at(t)]) continue;
        const double l = frozen[at(t)] - b.old_logp[at(t)];
        s += c.ratio_form == ratio::sequence ? l : gmpo_log(l, adv_at(t), c);
      }
      seq_log = s / n_i;
    } else if (c.ratio_form == ratio::vespo) {
      // A sum, not a mean: w is the product of the (clamped) token ratios.
      for (i64 t = begin; t < end; ++t) {
        if (lay.valid[at(t)]) seq_log += std::min(std::max(frozen[at(t)] - b.old_logp[at(t)], -20.0), 20.0);
      }
    }
    double split_threshold = 0;
    if (c.clip_mode == clip::entropy_split) {
      std::vector<double> h;
      for (i64 t = begin; t < end; ++t) {
        if (lay.valid[at(t)]) h.push_back(b.entropy[at(t)]);
      }
      split_threshold = linear_quantile(h, c.split_percentile);
    }
    i64 first_pos = -1, last_pos = -1;
    for (i64 t = begin; t < end; ++t) {
      if (!lay.valid[at(t)]) continue;
      if (first_pos < 0) first_pos = t;
      last_pos = t;
    }

    for (i64 t = begin; t < end; ++t) {
      if (!lay.valid[at(t)]) continue;
      const double lp = logp[at(t)];
      const double A = adv_at(t);

      // Policy term (policy tokens only).
      if (out.kept[at(t)]) {
        token_in in;
        in.A = A;
        in.lp = lp;
        in.fz = frozen[at(t)];
        in.old = b.old_logp[at(t)];
        in.seq_log = seq_log;
        in.eps_low = c.eps_low;
        in.eps_high = c.eps_high;
        if (c.clip_mode == clip::entropy_split && b.entropy[at(t)] > split_threshold) {
          in.eps_low = c.split_eps_low;
          in.eps_high = c.split_eps_high;
        }
        token_out tok = policy_token(c, in);
        if (c.select == selection::cov_kl && cov_sel[at(t)]) {  // KL-Cov: + coef |logp - old_logp|
          const double d = lp - in.old;
          tok.loss += c.cov_coef * std::fabs(d);
          tok.grad += c.cov_coef * (d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0);
        }
        const double coef = coefficient(c, b, lay, pg_counts, pg_global_tokens, pg_global_responses, i);
        const double iw = b.token_weights.empty() ? 1.0 : b.token_weights[at(t)];
        policy.add(coef * w * iw * tok.loss);
        out.grad_logp[at(t)] += coef * w * iw * tok.grad;

        n_policy += 1;
        n_clipped += tok.clipped ? 1 : 0;
        n_low += (tok.clipped && A < 0) ? 1 : 0;
        n_high += (tok.clipped && A > 0) ? 1 : 0;
        n_dual += tok.dual ? 1 : 0;
        sum_ppo_kl += b.old_logp[at(t)] - lp;
        sum_ratio += tok.shown;
        min_ratio = n_policy == 1 ? tok.shown : std::min(min_ratio, tok.shown);
        max_ratio = n_policy == 1 ? tok.shown : std::max(max_ratio, tok.shown);
        if (!b.entropy.empty()) sum_entropy_kept += b.entropy[at(t)];
      }

      const double coef_valid = coefficient(c, b, lay, valid_counts, c.norm_tokens, c.norm_responses, i);
      // KL term (valid tokens).
      if (c.kl_mode != kl::none) {
        kl_out k = kl_term(c, lp - b.ref_logp[at(t)], frozen[at(t)] - b.ref_logp[at(t)]);
        if (c.kl_importance_weighted) {
          // TRL: per_token_kl * coef_1 with coef_1 = exp(logp - old_logp) not detached, so the
          // product rule applies: d(k r) = (k' + k) r.
          const double r = std::exp(lp - b.old_logp[at(t)]);
          k.grad = (k.grad + k.value) * r;
          k.value *= r;
        }
        kl_total.add(c.kl_beta * coef_valid * k.value);
        out.grad_logp[at(t)] += c.kl_beta * coef_valid * k.grad;
        sum_ref_kl += k.value;
      }
      // Entropy bonus (valid tokens).
      if (c.entropy_bonus) {
        entropy_total.add(-c.entropy_coef * coef_valid * b.entropy[at(t)]);
        out.grad_entropy[at(t)] = -c.entropy_coef * coef_valid;
      }

      // Valid-token diagnostics.
      n_valid += 1;
      if (!b.entropy.empty()) sum_entropy += b.entropy[at(t)];
      sum_adv += A;
      const i64 third = 3 * (t - first_pos) / (last_pos - first_pos + 1);
      sum_var[third] += std::exp(lp) * -std::expm1(lp);  // p (1 - p)
      n_var[third] += 1;
    }
  }

  out.policy_loss = policy.value();
  out.kl_loss = kl_total.value();
  out.entropy_loss = entropy_total.value();
  out.loss = out.policy_loss + out.kl_loss + out.entropy_loss;

  auto ratio_or_zero = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  out.valid_tokens = static_cast<i64>(n_valid);
  out.policy_tokens = static_cast<i64>(n_policy);
  out.nonempty_responses = valid_counts.responses;
  out.clip_frac = ratio_or_zero(n_clipped, n_policy);
  out.clip_frac_low = ratio_or_zero(n_low, n_policy);
  out.clip_frac_high = ratio_or_zero(n_high, n_policy);
  out.dual_clip_frac = ratio_or_zero(n_dual, n_policy);
  out.ppo_kl = ratio_or_zero(sum_ppo_kl, n_policy);
  out.ratio_mean = ratio_or_zero(sum_ratio, n_policy);
  out.ratio_min = min_ratio;
  out.ratio_max = max_ratio;
  out.entropy_kept_mean = ratio_or_zero(sum_entropy_kept, n_policy);
  out.ref_kl_mean = ratio_or_zero(sum_ref_kl, n_valid);
  out.entropy_mean = ratio_or_zero(sum_entropy, n_valid);
  out.kept_frac = ratio_or_zero(n_policy, n_valid);
  for (int third = 0; third < 3; ++third) out.token_variance[third] = ratio_or_zero(sum_var[third], n_var[third]);

  // Advantage mean and population std over valid tokens (each carries its A_t: its response's
  // A_i unless given per token).
  out.advantage_mean = ratio_or_zero(sum_adv, n_valid);
  double ss_adv = 0;
  for (i64 i = 0; i < lay.R; ++i)
    for (i64 t = b.token_begin[at(i)]; t < b.token_end[at(i)]; ++t) {
      if (!lay.valid[at(t)]) continue;
      const double dev =
          (b.token_advantages.empty() ? out.advantages[at(i)] : b.token_advantages[at(t)]) - out.advantage_mean;
      ss_adv += dev * dev;
    }
  out.advantage_std = std::sqrt(ratio_or_zero(ss_adv, n_valid));

  // Weight diagnostics over non-empty responses.
  double n_nonempty = 0, sum_w = 0;
  for (i64 i = 0; i < lay.R; ++i) {
    if (lay.length[at(i)] == 0) continue;
    const double wi = out.weights[at(i)];
    n_nonempty += 1;
    sum_w += wi;
    out.weight_min = n_nonempty == 1 ? wi : std::min(out.weight_min, wi);
    out.weight_max = n_nonempty == 1 ? wi : std::max(out.weight_max, wi);
  }
  out.weight_mean = ratio_or_zero(sum_w, n_nonempty);
  return out;
}

}  // namespace

output evaluate(const batch& b, const config& c) { return compute(b, c, b.logp, b.logp); }

double frozen_loss(const batch& b, const config& c, const std::vector<double>& logp,
                   const std::vector<double>& frozen_logp) {
  return compute(b, c, logp, frozen_logp).loss;
}

// ---------------------------------------------------------------------------------------------
// Presets (docs/presets.md, with the conventions' constants).
// ---------------------------------------------------------------------------------------------

std::vector<std::string> preset_names() {
  return {"grpo",     "dr_grpo",   "dapo",       "gspo",          "cispo",           "aspo",       "reco",
          "reco_response_only", "reco_token_only", "dapo_reco", "rule_80_20", "rule_80_20_reco", "reco_no_cap",
          "trl_bnpo", "trl_luspo", "trl_vespo", "gpg", "sapo", "clip_cov", "kl_cov", "dppo"};
}

config preset(const std::string& name) {
  config c;  // defaults: grpo advantage (eps 1e-6, singleton -> 0), L = 20, k3 clamp on
  if (name == "grpo") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::token;
    c.clip_mode = clip::ppo;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::hard;
    c.dual_c = 3;
    c.weight_mode = weight::uniform;
    c.select = selection::all;
    c.agg = aggregation::seq_mean_token_mean;
    c.kl_mode = kl::k3;
    c.kl_beta = 0.001;
    return c;
  }
  if (name == "dr_grpo") {
    c.adv = advantage::dr_grpo;
    c.ratio_form = ratio::token;
    c.clip_mode = clip::ppo;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::seq_mean_token_sum_norm;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "dapo") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::token;
    c.clip_mode = clip::ppo;
    c.eps_low = 0.2;
    c.eps_high = 0.28;
    c.dual_mode = dual::hard;
    c.dual_c = 10;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "gspo") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::sequence;
    c.clip_mode = clip::ppo;
    c.eps_low = 3e-4;
    c.eps_high = 4e-4;
    c.dual_mode = dual::off;
    c.agg = aggregation::seq_mean_token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "cispo") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::cispo;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "aspo") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::flipped;
    c.clip_mode = clip::ppo;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::soft;
    c.dual_c = 3;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::k3;
    c.kl_beta = 0.001;
    return c;
  }
  if (name == "reco") {
    c = preset("grpo");
    c.ratio_form = ratio::variance;
    c.weight_mode = weight::expected_count;
    c.weight_cap = 10;
    return c;
  }
  if (name == "reco_response_only") {
    c = preset("reco");
    c.ratio_form = ratio::token;
    return c;
  }
  if (name == "reco_token_only") {
    c = preset("reco");
    c.weight_mode = weight::uniform;
    return c;
  }
  if (name == "reco_no_cap") {
    c = preset("reco");
    c.weight_cap = 0;
    return c;
  }
  if (name == "dapo_reco") {
    c = preset("dapo");
    c.ratio_form = ratio::variance;
    c.weight_mode = weight::expected_count;
    c.weight_cap = 10;
    return c;
  }
  // verl's clip_cov / kl_cov (verl/trainer/config/actor/actor.yaml): clip 0.2 both sides, no
  // dual clip, no log-ratio clamp, token-mean; ratios 2e-4, clip bounds (1, 5), KL coef 0.1.
  if (name == "clip_cov" || name == "kl_cov") {
    c.adv = advantage::grpo;
    c.ratio_form = ratio::token;
    c.log_ratio_clamp = 0;
    c.clip_mode = name == "clip_cov" ? clip::ppo : clip::none;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::none;
    c.select = name == "clip_cov" ? selection::cov_clip : selection::cov_kl;
    c.cov_ratio = 2e-4;
    c.cov_lb = 1;
    c.cov_ub = 5;
    c.cov_coef = 0.1;
    return c;
  }
  if (name == "rule_80_20") {
    c = preset("dapo");
    c.select = selection::top_k;
    c.rho = 0.2;
    c.denom = denominator::valid;
    return c;
  }
  if (name == "rule_80_20_reco") {
    c = preset("rule_80_20");
    c.ratio_form = ratio::variance;
    c.weight_mode = weight::expected_count;
    c.weight_cap = 10;
    return c;
  }
  // TRL (trl/trainer/grpo_config.py defaults): A = (r - mean) / (std + 1e-4), no log-ratio clamp,
  // epsilon 0.2 both sides, beta = 0 (no KL), no dual clip.
  if (name == "trl_bnpo" || name == "trl_luspo" || name == "trl_vespo") {
    c.adv = advantage::grpo;
    c.adv_eps = 1e-4;
    c.log_ratio_clamp = 0;
    c.clip_mode = clip::ppo;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.select = selection::all;
    c.kl_mode = kl::none;
    if (name == "trl_bnpo") {
      c.ratio_form = ratio::token;
      c.agg = aggregation::token_mean;  // over the call's own tokens
    } else if (name == "trl_luspo") {
      c.ratio_form = ratio::sequence;  // importance_sampling_level = "sequence"
      c.agg = aggregation::seq_mean_token_sum_all;
    } else {
      c.ratio_form = ratio::vespo;
      c.clip_mode = clip::none;
      c.agg = aggregation::token_mean;
    }
    return c;
  }
  if (name == "gpg") {  // verl loss_mode "gpg": pg = -A logp, token-mean; GPG's advantage
    c.adv = advantage::gpg;
    c.ratio_form = ratio::reinforce;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "sapo") {  // verl loss_mode "sapo": gate sigmoid(tau (r - 1)) 4 / tau, seq-mean-token-mean
    c.adv = advantage::grpo;
    c.ratio_form = ratio::sapo;
    c.sapo_tau_pos = 1.0;
    c.sapo_tau_neg = 1.05;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::seq_mean_token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  if (name == "dppo") {  // verl compute_policy_loss_dppo_tv's own defaults: eps 0.2, c 20, token-mean
    c.adv = advantage::grpo;
    c.ratio_form = ratio::dppo;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.weight_mode = weight::uniform;
    c.agg = aggregation::token_mean;
    c.kl_mode = kl::none;
    return c;
  }
  // Peer presets (reco/registry.hpp's peer_preset_table), written here from the peers' own
  // defaults rather than from the table.
  if (name == "trl_dapo") return preset("trl_bnpo");  // the global token count comes from the caller
  if (name == "trl_dr_grpo") {  // loss_type "dr_grpo" with scale_rewards "none"
    c = preset("dr_grpo");
    c.log_ratio_clamp = 0;
    return c;
  }
  if (name == "trl_cispo") {  // -clamp(r, max=epsilon_high).detach() * A * logp, epsilon_high 5
    c = preset("cispo");
    c.adv_eps = 1e-4;
    c.log_ratio_clamp = 0;
    c.cispo_eps_low = 1.0;   // no lower bound: 1 - 1 = 0
    c.cispo_eps_high = 4.0;  // the cap is 1 + 4 = epsilon_high
    return c;
  }
  if (name == "verl_vanilla") {  // ActorConfig: clip_ratio 0.2/0.2, clip_ratio_c 3, token-mean
    c = preset("dapo");
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::hard;
    c.dual_c = 3;
    return c;
  }
  if (name == "verl_cispo") {  // clamp(r, 1 - 0.2, 1 + 0.2).detach() * A * logp
    c = preset("cispo");
    c.cispo_eps_low = 0.2;
    c.cispo_eps_high = 0.2;
    return c;
  }
  if (name == "verl_dppo_tv" || name == "verl_dppo_kl") {  // ActorConfig: clip_ratio 0.2, clip_ratio_c 3
    c = preset("dppo");
    c.dppo_binary_kl = name == "verl_dppo_kl";
    c.dppo_eps_low = 0.2;
    c.dppo_eps_high = 0.2;
    c.dppo_c = 3;
    return c;
  }
  if (name == "trl_sapo") {  // TRL: std + 1e-4, no log-ratio clamp
    c = preset("sapo");
    c.adv_eps = 1e-4;
    c.log_ratio_clamp = 0;
    return c;
  }
  if (name == "openrlhf_ppo") {  // PolicyLoss(0.2, 0.2), token_level_loss, exp(clamp(logp - old, +-20))
    c = preset("dapo");
    c.adv_eps = 1e-9;
    c.eps_low = 0.2;
    c.eps_high = 0.2;
    c.dual_mode = dual::off;
    return c;
  }
  throw std::invalid_argument("reco_ref: unknown preset '" + name + "'");
}

}  // namespace reco_ref
