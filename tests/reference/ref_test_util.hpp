// Test helpers for the reference self-check: random ragged batches and a finite-difference
// gradient check against reco_ref::frozen_loss.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/reco_ref.hpp"

namespace reco_ref_test {

using i64 = std::int64_t;

inline std::size_t at(i64 index) { return static_cast<std::size_t>(index); }

struct batch_shape {
  bool packed = true;          // packed ranges with gaps between them; else padded [i*T, (i+1)*T)
  bool use_mask = true;        // packed only: false leaves batch.mask empty (no fully masked row)
  bool token_weights = false;  // fill batch.token_weights
  bool wide_ref = false;       // put some ref_logp far from logp, so that the k3 clamps bite
  double off_policy = 0.5;     // std of old_logp - logp on the off-policy tokens
};

// A random ragged batch: 4-6 groups with sizes 1..5 (at least one singleton), responses of
// length 0..8 (at least one of length 0 and one of length 1), one fully masked row when a mask is
// used, some groups with all-equal rewards, 60% of the tokens off-policy (10% far off). Every value of an
// invalid token (padding, masked, between ranges) is NaN, so that reading one poisons the loss.
inline reco_ref::batch random_batch(std::uint64_t seed, const batch_shape& shape) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto integer = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  auto normal = [&](double sd) { return std::normal_distribution<double>(0.0, sd)(rng); };
  const double nan = std::numeric_limits<double>::quiet_NaN();

  reco_ref::batch b;
  const i64 P = integer(4, 6);
  std::vector<i64> sizes(at(P));
  for (auto& g : sizes) g = integer(2, 5);
  sizes[0] = 1;  // one singleton group, moved to a random place
  std::shuffle(sizes.begin(), sizes.end(), rng);
  b.group_offsets.push_back(0);
  for (i64 g : sizes) b.group_offsets.push_back(b.group_offsets.back() + g);
  const i64 R = b.group_offsets.back();

  std::vector<i64> length(at(R));
  for (auto& n : length) n = integer(0, 8);
  const i64 zero_len = integer(0, R - 1);
  i64 one_len = integer(0, R - 1);
  if (one_len == zero_len) one_len = (one_len + 1) % R;
  length[at(zero_len)] = 0;
  length[at(one_len)] = 1;
  i64 masked_row = -1;  // a response whose range is non-empty but fully masked
  if (!shape.packed || shape.use_mask) {
    for (i64 i = 0; i < R; ++i) {
      if (i != zero_len && i != one_len && length[at(i)] >= 2) {
        masked_row = i;
        break;
      }
    }
  }

  // Token ranges and validity.
  std::vector<std::uint8_t> valid;
  if (shape.packed) {
    i64 pos = 0;
    for (i64 i = 0; i < R; ++i) {
      const i64 gap = integer(0, 2);  // tokens that belong to no response
      for (i64 k = 0; k < gap; ++k) valid.push_back(0);
      pos += gap;
      b.token_begin.push_back(pos);
      // Masked positions inside the range lengthen it; the valid count stays length[i].
      for (i64 k = 0; k < length[at(i)];) {
        const bool hole = shape.use_mask && uniform(0, 1) < 0.15;
        valid.push_back(hole ? 0 : 1);
        k += hole ? 0 : 1;
        pos += 1;
      }
      b.token_end.push_back(pos);
      b.max_length = std::max(b.max_length, b.token_end.back() - b.token_begin.back());
    }
    b.num_tokens = pos;
  } else {
    i64 T = 1;
    for (i64 n : length) T = std::max(T, n);
    for (i64 i = 0; i < R; ++i) {
      b.token_begin.push_back(i * T);
      b.token_end.push_back((i + 1) * T);
      for (i64 k = 0; k < T; ++k) valid.push_back(k < length[at(i)] ? 1 : 0);
    }
    b.num_tokens = R * T;
    b.max_length = T;
  }
  if (masked_row >= 0) {
    for (i64 t = b.token_begin[at(masked_row)]; t < b.token_end[at(masked_row)]; ++t) valid[at(t)] = 0;
  }
  if (!shape.packed || shape.use_mask) b.mask = valid;

  // Rewards: per group binary, real-valued or all equal; at least one all-equal group of size
  // >= 2 when there is one, and one binary group.
  b.rewards.assign(at(R), 0.0);
  i64 equal_group = -1;
  for (i64 g = 0; g < P; ++g) {
    if (sizes[at(g)] >= 2) {
      equal_group = g;
      break;
    }
  }
  for (i64 g = 0; g < P; ++g) {
    const i64 kind = g == equal_group ? 2 : (g == (equal_group + 1) % P ? 0 : integer(0, 2));
    const double constant = std::round(uniform(-1, 2));
    for (i64 i = b.group_offsets[at(g)]; i < b.group_offsets[at(g + 1)]; ++i) {
      b.rewards[at(i)] = kind == 0 ? static_cast<double>(integer(0, 1)) : (kind == 1 ? normal(1.0) : constant);
    }
  }
  b.advantages.assign(at(R), 0.0);
  b.response_weights.assign(at(R), 0.0);
  for (i64 i = 0; i < R; ++i) {
    b.advantages[at(i)] = normal(1.0);
    b.response_weights[at(i)] = uniform(0.1, 4.0);
  }

  const std::size_t N = at(b.num_tokens);
  b.logp.assign(N, nan);
  b.old_logp.assign(N, nan);
  b.ref_logp.assign(N, nan);
  b.entropy.assign(N, nan);
  if (shape.token_weights) b.token_weights.assign(N, nan);
  for (std::size_t t = 0; t < N; ++t) {
    if (!valid[t]) continue;
    const double lp = uniform(0, 1) < 0.1 ? -uniform(1e-3, 2e-2) : uniform(-4.0, -0.02);
    b.logp[t] = lp;
    const double kind = uniform(0, 1);
    if (kind < 0.4) {
      b.old_logp[t] = lp;  // on-policy token
    } else if (kind < 0.9) {
      b.old_logp[t] = std::min(lp + normal(shape.off_policy), -1e-4);
    } else {
      // Far off-policy: |logp - old_logp| in [1.2, 2.6], beyond the dual clips (c = 3 and 10)
      // and CISPO's upper bound (r > 6).
      const double l = uniform(1.2, 2.6) * (uniform(0, 1) < 0.5 ? -1 : 1);
      b.old_logp[t] = lp - l < -1e-4 ? lp - l : lp - std::fabs(l);
    }
    b.ref_logp[t] = lp + normal(0.4);
    // Wide: d = logp - ref in [-25, -2] or [2, 12]. Past |d| ~ 10 the k3 value clamp bites
    // (d > 0: k ~ d - 1; d < 0: k ~ e^-d), past d = -20 the exponent clamp too; d is kept above
    // -12 so that the unclamped k3 (e^-d) stays small enough for a difference quotient.
    if (shape.wide_ref && uniform(0, 1) < 0.15) b.ref_logp[t] = lp - (uniform(0, 1) < 0.5 ? -uniform(2, 12) : uniform(2, 25));
    b.entropy[t] = uniform(0.0, 4.0);
    if (shape.token_weights) b.token_weights[t] = uniform(0.5, 1.5);
  }
  return b;
}

inline batch_shape shape_for_seed(std::uint64_t seed) {
  batch_shape s;
  s.packed = seed % 2 == 0;
  s.use_mask = seed % 6 != 0;
  s.token_weights = seed % 3 == 1;
  s.wide_ref = seed % 4 == 3;
  s.off_policy = seed % 5 == 2 ? 1.0 : 0.5;
  return s;
}

// Owner response of each token (-1 for none) and validity, computed independently of the
// reference for the test's own bookkeeping.
inline std::vector<i64> owners(const reco_ref::batch& b) {
  std::vector<i64> owner(at(b.num_tokens), -1);
  for (std::size_t i = 0; i < b.token_begin.size(); ++i) {
    for (i64 t = b.token_begin[i]; t < b.token_end[i]; ++t) {
      if (b.mask.empty() || b.mask[at(t)] != 0) owner[at(t)] = static_cast<i64>(i);
    }
  }
  return owner;
}

// Whether moving logp_t by up to `delta` can cross a point where the frozen loss is not smooth
// (a clip, clamp or dual-clip boundary, or a kink of a KL estimator). Every such boundary is a
// value of log x (x the ratio the clip sees), which moves one-for-one with logp_t.
inline bool near_kink(const reco_ref::batch& b, const reco_ref::config& c, const reco_ref::output& o,
                      const std::vector<i64>& owner, i64 t, double delta) {
  using reco_ref::ratio;
  auto near = [&](double q, double boundary) { return std::fabs(q - boundary) < delta; };
  const i64 i = owner[at(t)];
  const double A = o.advantages[at(i)];
  const double lp = b.logp[at(t)], old = b.old_logp[at(t)];
  const double l = lp - old, L = c.log_ratio_clamp;

  if (o.kept[at(t)] && A != 0) {
    bool movable = true;
    double logx = 0;
    switch (c.ratio_form) {
      case ratio::token:
      case ratio::flipped:
      case ratio::flipped_all:
      case ratio::sapo:
        if (L > 0 && (near(l, L) || near(l, -L))) return true;
        logx = l;
        break;
      case ratio::variance: {
        const double lv = (lp + std::log(-std::expm1(lp))) - (old + std::log(-std::expm1(old)));
        if (L > 0 && (near(lv, L) || near(lv, -L))) return true;
        logx = lv;
        break;
      }
      case ratio::sequence: {
        double s = 0, n = 0;
        for (i64 u = b.token_begin[at(i)]; u < b.token_end[at(i)]; ++u) {
          if (owner[at(u)] != i) continue;
          s += b.logp[at(u)] - b.old_logp[at(u)];
          n += 1;
        }
        logx = s / n;
        movable = logx <= c.seq_max_log;
        break;
      }
      case ratio::gmpo: {
        if (near(l, c.gmpo_eps_high) || near(l, -c.gmpo_eps_low)) return true;
        double s = 0, n = 0;
        for (i64 u = b.token_begin[at(i)]; u < b.token_end[at(i)]; ++u) {
          if (owner[at(u)] != i) continue;
          const double lu = b.logp[at(u)] - b.old_logp[at(u)];
          const double cl = std::min(std::max(lu, -c.gmpo_eps_low), c.gmpo_eps_high);
          s += A > 0 ? std::min(lu, cl) : std::max(lu, cl);
          n += 1;
        }
        logx = s / n;
        break;
      }
      case ratio::reinforce:
      case ratio::cispo:
      case ratio::vespo:
      case ratio::dppo:  // the weight (and DPPO's region) is frozen: the loss is linear in logp
        movable = false;
        break;
    }
    const bool clip_based = c.ratio_form != ratio::reinforce && c.ratio_form != ratio::cispo &&
                            c.ratio_form != ratio::sapo && c.ratio_form != ratio::vespo &&
                            c.ratio_form != ratio::dppo;
    if (movable && clip_based && c.clip_mode != reco_ref::clip::none) {
      const double eps[2][2] = {{c.eps_low, c.eps_high}, {c.split_eps_low, c.split_eps_high}};
      for (const auto& e : eps) {
        if (near(logx, std::log1p(e[1]))) return true;
        if (1 - e[0] > 0 && near(logx, std::log(1 - e[0]))) return true;
      }
      if (c.delta > 0 && near(logx, std::log(c.delta))) return true;
      if (c.dual_mode != reco_ref::dual::off &&
          (near(logx, std::log(c.dual_c)) || near(logx, -std::log(c.dual_c)))) {
        return true;
      }
    }
  }

  if (c.kl_mode != reco_ref::kl::none) {
    const double d = lp - b.ref_logp[at(t)];
    if (c.kl_mode == reco_ref::kl::abs && near(d, 0)) return true;
    if (c.kl_mode == reco_ref::kl::k3 && c.kl_clamp) {
      if (near(d, 20) || near(d, -20)) return true;
      auto k3 = [](double dd) { return std::expm1(-dd) + dd; };
      if ((k3(d - delta) > 10) != (k3(d + delta) > 10)) return true;
    }
  }
  return false;
}

struct fd_report {
  i64 checked = 0;          // valid tokens compared
  i64 skipped = 0;          // valid tokens next to a kink
  i64 invalid = 0;          // invalid tokens checked for exact zeros
  i64 entropy_checked = 0;  // tokens whose grad_entropy was compared
  double worst = 0;         // max |fd - analytic| / (|analytic| + floor)
};

// Central differences of frozen_loss in logp (and of the loss in entropy) against the analytic
// gradients. Tolerance: |fd - g| <= rel_tol * (|g| + scale), scale = max_t |g_t| + the size of
// the loss parts: relative for the tokens that carry the gradient, and relative to the batch's
// scale for a token whose own gradient is tiny (a central difference with h = 1e-6 of an O(0.1)
// loss resolves about 1e-11 absolute; measured errors are about 3e-9 relative and 1e-9 of the
// scale).
inline fd_report check_gradients(const reco_ref::batch& b, const reco_ref::config& c,
                                 double rel_tol = 1e-8, double h = 1e-6, double kink_delta = 1e-5) {
  fd_report rep;
  const reco_ref::output o = reco_ref::evaluate(b, c);
  EXPECT_EQ(reco_ref::frozen_loss(b, c, b.logp, b.logp), o.loss);
  EXPECT_TRUE(std::isfinite(o.loss));
  const std::vector<i64> owner = owners(b);
  double gmax = 0;
  for (double g : o.grad_logp) gmax = std::max(gmax, std::fabs(g));
  // Scale of the check: the largest gradient plus the size of the loss parts (a difference
  // quotient of a loss of size S resolves about 1e-16 S / h in absolute terms).
  const double loss_size = std::fabs(o.policy_loss) + std::fabs(o.kl_loss) + std::fabs(o.entropy_loss);
  const double floor_logp = gmax + loss_size + 1e-12;

  for (i64 t = 0; t < b.num_tokens; ++t) {
    std::vector<double> plus = b.logp, minus = b.logp;
    plus[at(t)] += h;
    minus[at(t)] -= h;
    const double fp = reco_ref::frozen_loss(b, c, plus, b.logp);
    const double fm = reco_ref::frozen_loss(b, c, minus, b.logp);
    if (owner[at(t)] < 0) {
      // Invalid: never read, exactly zero gradient.
      EXPECT_EQ(o.grad_logp[at(t)], 0.0) << "token " << t;
      EXPECT_EQ(o.grad_entropy[at(t)], 0.0) << "token " << t;
      EXPECT_EQ(o.kept[at(t)], 0) << "token " << t;
      EXPECT_EQ(fp, fm) << "token " << t;
      rep.invalid += 1;
      continue;
    }
    if (near_kink(b, c, o, owner, t, kink_delta)) {
      rep.skipped += 1;
      continue;
    }
    const double fd = (fp - fm) / (plus[at(t)] - minus[at(t)]);  // the step actually taken
    const double g = o.grad_logp[at(t)];
    const double err = std::fabs(fd - g) / (std::fabs(g) + floor_logp);
    rep.worst = std::max(rep.worst, err);
    EXPECT_LE(err, rel_tol) << "token " << t << " analytic " << g << " fd " << fd;
    rep.checked += 1;
  }

  // grad_entropy: the loss depends smoothly on H only through the entropy bonus; selection and
  // the entropy-split clip depend on the order of the entropies, so tokens whose entropy lies
  // within kink_delta of another valid token's are skipped.
  if (!b.entropy.empty()) {
    // The resolution of the difference depends on the loss, not on the variable: the floor is
    // the largest gradient in either variable.
    double hmax = gmax;
    for (double g : o.grad_entropy) hmax = std::max(hmax, std::fabs(g));
    const double floor_h = hmax + loss_size + 1e-12;
    for (i64 t = 0; t < b.num_tokens; ++t) {
      if (owner[at(t)] < 0) continue;
      bool close = false;
      for (i64 u = 0; u < b.num_tokens; ++u) {
        if (u != t && owner[at(u)] >= 0 && std::fabs(b.entropy[at(u)] - b.entropy[at(t)]) < kink_delta) close = true;
      }
      if (close) continue;
      reco_ref::batch bp = b, bm = b;
      bp.entropy[at(t)] += h;
      bm.entropy[at(t)] -= h;
      const double fd = (reco_ref::evaluate(bp, c).loss - reco_ref::evaluate(bm, c).loss) /
                        (bp.entropy[at(t)] - bm.entropy[at(t)]);
      const double g = o.grad_entropy[at(t)];
      const double err = std::fabs(fd - g) / (std::fabs(g) + floor_h);
      rep.worst = std::max(rep.worst, err);
      EXPECT_LE(err, rel_tol) << "entropy of token " << t << " analytic " << g << " fd " << fd;
      rep.entropy_checked += 1;
    }
  }
  return rep;
}

}  // namespace reco_ref_test
