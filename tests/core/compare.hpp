// Compares one library objective with the independent double-precision reference on a batch:
// loss parts, gradients (logp and entropy) and every diagnostic. The CPU backend runs the token
// pass on packs (vectorised) or token by token (scalar, the device path's arithmetic); both are
// compared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/random_batch.hpp"
#include "reco/backend/cpu.hpp"
#include "reco/objective.hpp"

namespace reco_test {

struct tolerances {
  double rel;       // relative error on values and gradients
  double abs_frac;  // absolute floor as a fraction of the largest gradient / loss part
  double diag_rel;  // relative error on the diagnostics
  double diag_abs;  // ... and their absolute floor
  bool flips;       // a branch decision may differ for a token at a threshold (float math)
};
// Float inputs: the packed token pass computes each term in float, within 36u (u = 2^-24) of the
// double value with the default clamps (docs/conventions.md, "Precision"); 10^-5 is 168u, the
// margin covering the compositions' compounded terms. Double inputs: double throughout.
template <class T>
tolerances tolerances_for() {
  return std::is_same_v<T, float> ? tolerances{1e-5, 1e-9, 1e-5, 1e-7, true} : tolerances{1e-10, 1e-14, 1e-9, 1e-12, false};
}

inline ::testing::AssertionResult close(double got, double want, double rel, double abs_floor, const std::string& what) {
  const double err = std::fabs(got - want);
  if (err <= rel * std::fabs(want) + abs_floor || (std::isnan(got) && std::isnan(want))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": got " << got << ", want " << want << " (err " << err << ")";
}

struct library_output {
  reco::objective_result result;
  std::vector<double> grad_logp, grad_entropy;
};

// The CPU backend with the packed (vectorised) or the scalar token pass.
inline reco::cpu cpu_backend(bool vectorise) {
  reco::cpu be;
  be.vectorise = vectorise;
  return be;
}
inline std::string path_name(bool vectorise) { return vectorise ? " (packed)" : " (scalar)"; }

template <class T, class Obj>
library_output run_library(const Obj& obj, const master_batch& m, const reco::normalisers& norm = {},
                           bool vectorise = true) {
  typed_batch<T> tb(m);
  std::vector<T> g(m.logp.size(), T(-5)), gh(m.logp.size(), T(-5));
  reco::workspace<reco::cpu> ws;
  library_output out;
  // needs(): an objective with a selectable entropy term writes its gradient only while it is on.
  const bool entropy_gradient = obj.needs().entropy_gradient;
  out.result = obj(cpu_backend(vectorise), tb.view(),
                   reco::gradients<T>{g, entropy_gradient ? reco::span<T>(gh) : reco::span<T>()}, ws, norm);
  out.grad_logp.assign(g.begin(), g.end());
  if (entropy_gradient) out.grad_entropy.assign(gh.begin(), gh.end());
  return out;
}

inline void expect_matches(const library_output& lib, const reco_ref::output& ref, const tolerances& tol,
                           const std::string& label) {
  SCOPED_TRACE(label);
  const auto& r = lib.result;
  const double loss_scale = std::max({std::fabs(ref.policy_loss), std::fabs(ref.kl_loss), std::fabs(ref.entropy_loss), 1e-3});
  // The policy loss of float math is within the bound of its terms' magnitudes, not of its value
  // (GRPO's advantages sum to 0 per group, so it cancels): |loss term| = |gradient term| for
  // every unclipped token, and a clipped one has no gradient, hence the unclipped share.
  double terms = 0;
  for (double g : ref.grad_logp) terms += std::fabs(g);
  terms /= std::max(0.05, 1 - ref.clip_frac - ref.dual_clip_frac);
  const double policy_abs = tol.abs_frac * loss_scale + (tol.flips ? tol.rel * terms : 0.0);
  EXPECT_TRUE(close(r.loss, ref.loss, tol.rel, policy_abs, "loss"));
  EXPECT_TRUE(close(r.policy_loss, ref.policy_loss, tol.rel, policy_abs, "policy_loss"));
  EXPECT_TRUE(close(r.kl_loss, ref.kl_loss, tol.rel, tol.abs_frac * loss_scale, "kl_loss"));
  EXPECT_TRUE(close(r.entropy_loss, ref.entropy_loss, tol.rel, tol.abs_frac * loss_scale, "entropy_loss"));

  double gmax = 0;
  for (double x : ref.grad_logp) gmax = std::max(gmax, std::fabs(x));
  ASSERT_EQ(lib.grad_logp.size(), ref.grad_logp.size());
  // With float math a token at a branch's threshold may take the other branch: at most one in
  // 10,000, plus one, may then differ by its whole term.
  const std::size_t allowed = tol.flips ? 1 + ref.grad_logp.size() / 10000 : 0;
  std::size_t bad = 0;
  for (std::size_t t = 0; t < ref.grad_logp.size() && bad < allowed + 5; ++t) {
    auto c = close(lib.grad_logp[t], ref.grad_logp[t], tol.rel, tol.abs_frac * gmax, "grad_logp[" + std::to_string(t) + "]");
    if (!c && ++bad > allowed) ADD_FAILURE() << c.message();
  }
  if (!lib.grad_entropy.empty()) {
    ASSERT_EQ(lib.grad_entropy.size(), ref.grad_entropy.size());
    double hmax = 0;
    for (double x : ref.grad_entropy) hmax = std::max(hmax, std::fabs(x));
    for (std::size_t t = 0; t < ref.grad_entropy.size(); ++t)
      ASSERT_TRUE(close(lib.grad_entropy[t], ref.grad_entropy[t], tol.rel, tol.abs_frac * hmax,
                        "grad_entropy[" + std::to_string(t) + "]"));
  }

  // Diagnostics: from the same inputs on both sides. Those of the per-token terms within the
  // precision bound (the fractions: a flipped token moves them by one token's share); the entropy
  // means, sums of the inputs, within 7u for float inputs (float lanes add blocks of 8 entropies
  // before their double sums; 8u with the double sums' roundings) and in double otherwise; the
  // others (per-response values) in double either way.
  const double d_rel = tol.diag_rel, d_abs = tol.diag_abs;
  const auto& s = r.stats;
  const double share = tol.flips ? (1.0 + static_cast<double>(ref.policy_tokens) / 10000) /
                                       std::max(1.0, static_cast<double>(ref.policy_tokens))
                                 : 0.0;
  EXPECT_TRUE(close(s.clip_frac, ref.clip_frac, d_rel, d_abs + share, "clip_frac"));
  EXPECT_TRUE(close(s.clip_frac_low, ref.clip_frac_low, d_rel, d_abs + share, "clip_frac_low"));
  EXPECT_TRUE(close(s.clip_frac_high, ref.clip_frac_high, d_rel, d_abs + share, "clip_frac_high"));
  EXPECT_TRUE(close(s.dual_clip_frac, ref.dual_clip_frac, d_rel, d_abs + share, "dual_clip_frac"));
  EXPECT_TRUE(close(s.ppo_kl, ref.ppo_kl, d_rel, d_abs, "ppo_kl"));
  EXPECT_TRUE(close(s.ratio_mean, ref.ratio_mean, d_rel, d_abs, "ratio_mean"));
  EXPECT_TRUE(close(s.ratio_min, ref.ratio_min, d_rel, d_abs, "ratio_min"));
  EXPECT_TRUE(close(s.ratio_max, ref.ratio_max, d_rel, d_abs, "ratio_max"));
  EXPECT_TRUE(close(s.ref_kl_mean, ref.ref_kl_mean, d_rel, d_abs, "ref_kl_mean"));
  const double h_rel = tol.flips ? 8 * 0x1p-24 : 1e-9;
  EXPECT_TRUE(close(s.entropy_mean, ref.entropy_mean, h_rel, 1e-12, "entropy_mean"));
  EXPECT_TRUE(close(s.entropy_kept_mean, ref.entropy_kept_mean, h_rel, 1e-12, "entropy_kept_mean"));
  EXPECT_TRUE(close(s.kept_frac, ref.kept_frac, 1e-9, 1e-12, "kept_frac"));
  EXPECT_TRUE(close(s.weight_mean, ref.weight_mean, 1e-9, 1e-12, "weight_mean"));
  EXPECT_TRUE(close(s.weight_min, ref.weight_min, 1e-9, 1e-12, "weight_min"));
  EXPECT_TRUE(close(s.weight_max, ref.weight_max, 1e-9, 1e-12, "weight_max"));
  EXPECT_EQ(s.weight_cap_hits, ref.weight_cap_hits);
  EXPECT_TRUE(close(s.zero_std_group_frac, ref.zero_std_group_frac, 1e-9, 1e-12, "zero_std_group_frac"));
  EXPECT_TRUE(close(s.advantage_mean, ref.advantage_mean, 1e-9, 1e-12, "advantage_mean"));
  EXPECT_TRUE(close(s.advantage_std, ref.advantage_std, 1e-8, 1e-10, "advantage_std"));
  for (int k = 0; k < 3; ++k)
    EXPECT_TRUE(close(s.token_variance[k], ref.token_variance[k], d_rel, d_abs, "token_variance[" + std::to_string(k) + "]"));
  EXPECT_EQ(s.valid_tokens, ref.valid_tokens);
  EXPECT_EQ(s.policy_tokens, ref.policy_tokens);
  EXPECT_EQ(s.nonempty_responses, ref.nonempty_responses);
}

// Library vs reference on the standard sweep of ragged batches, in float and double, on both
// token paths.
template <class Obj>
void check_against_reference(const Obj& obj, const reco_ref::config& cfg, const std::string& name,
                             std::uint64_t seed_base = 1000) {
  const auto specs = standard_specs();
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const master_batch m0 = make_batch(seed_base + k, specs[k]);
    master_batch m32 = m0;
    round_to<float>(m32);
    const reco_ref::output ref32 = reco_ref::evaluate(to_reference(m32), cfg);
    const reco_ref::output ref64 = reco_ref::evaluate(to_reference(m0), cfg);
    for (bool vectorise : {true, false}) {
      const std::string path = path_name(vectorise);
      expect_matches(run_library<float>(obj, m32, {}, vectorise), ref32, tolerances_for<float>(),
                     name + " float batch " + std::to_string(k) + path);
      expect_matches(run_library<double>(obj, m0, {}, vectorise), ref64, tolerances_for<double>(),
                     name + " double batch " + std::to_string(k) + path);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Central finite differences (h = 1e-6) of the reference's frozen loss against the library's
// analytic gradient, in double. Tokens sitting on a kink (where the one-sided slopes disagree)
// are skipped; they must be rare.
template <class Obj>
void check_finite_differences(const Obj& obj, const reco_ref::config& cfg, const std::string& name, std::uint64_t seed,
                              bool vectorise = true, bool token_advantages = false) {
  batch_spec spec;
  spec.token_advantages = token_advantages;
  spec.groups = 4;
  spec.max_group = 5;
  spec.max_length = 9;
  spec.padded = seed % 2 == 0;
  spec.response_weights = true;
  const master_batch m = make_batch(seed, spec);
  const library_output lib = run_library<double>(obj, m, {}, vectorise);
  const reco_ref::batch rb = to_reference(m);
  const double h = 1e-6;
  double gmax = 0;
  for (double x : lib.grad_logp) gmax = std::max(gmax, std::fabs(x));
  int checked = 0, kinks = 0;
  for (std::size_t t = 0; t < m.logp.size(); ++t) {
    std::vector<double> up = m.logp, down = m.logp;
    up[t] += h;
    down[t] -= h;
    const double f0 = reco_ref::frozen_loss(rb, cfg, m.logp, m.logp);
    const double fu = reco_ref::frozen_loss(rb, cfg, up, m.logp);
    const double fd = reco_ref::frozen_loss(rb, cfg, down, m.logp);
    const double right = (fu - f0) / h, left = (f0 - fd) / h, central = (fu - fd) / (2 * h);
    if (std::fabs(right - left) > 1e-4 * (gmax + 1e-12)) {
      ++kinks;
      continue;
    }
    ++checked;
    EXPECT_NEAR(lib.grad_logp[t], central, 1e-7 * (std::fabs(central) + gmax) + 1e-12)
        << name << path_name(vectorise) << " token " << t << " (masked: " << !m.mask[t] << ")";
  }
  EXPECT_GT(checked, 0) << name;
  EXPECT_LE(kinks, static_cast<int>(m.logp.size() / 20) + 1) << name << ": too many kinks skipped";
}

}  // namespace reco_test
