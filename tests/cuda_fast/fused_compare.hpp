// Comparisons of a fused objective call with the generic path's call of the same data, for the
// host emulation and the GPU tests: double inputs to rounding, float inputs within the float
// precision policy (docs/conventions.md, "Precision"), since the fused kernels and the CPU's
// packed pass compute float inputs' terms in float with different exponentials.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "reco/result.hpp"

namespace fused_test {

// Gradients, double inputs: the per-token arithmetic is the generic token pass's, but the CPU
// backend evaluates it with SIMD math functions (a different last bit of exp / log), and
// batch-wide statistics are summed in another order; 1e-12 relative is rounding, while any
// difference in the formulas shows far above it.
inline ::testing::AssertionResult same_gradient(double fused_value, double generic_value) {
  const double f = fused_value, g = generic_value;
  const double tol = 1e-12 * std::fabs(g) + 1e-300;
  if (std::fabs(f - g) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "fused " << f << ", generic " << g;
}

inline ::testing::AssertionResult close(double got, double want, const char* what, double rel = 1e-12, double abs = 1e-15) {
  const double tol = rel * std::fabs(want) + abs;
  if (std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": fused " << got << ", generic " << want;
}

// Float inputs: two float computations of the same terms, each within the precision policy's
// 36u of the double value; 10^-5 relative covers both (the core tests' float tolerance), a loss
// part is held to it relative to the magnitudes of its terms (they cancel), and a token at a
// branch's threshold may take the other branch on one side (at most one in 10,000, plus one).
struct float_scales {
  double terms = 0;  // the sum of the policy terms' magnitudes (the gradient's, over the unclipped share)
  double gmax = 0, hmax = 0;
  double share = 0;  // one token's share of the policy tokens, times the flips allowed
};
template <class T>
float_scales float_scales_of(const std::vector<T>& g, const std::vector<T>& gh, const reco::objective_result& r) {
  float_scales s;
  for (T x : g) {
    s.terms += std::fabs(static_cast<double>(x));
    s.gmax = std::max(s.gmax, std::fabs(static_cast<double>(x)));
  }
  for (T x : gh) s.hmax = std::max(s.hmax, std::fabs(static_cast<double>(x)));
  s.terms /= std::max(0.05, 1 - r.stats.clip_frac - r.stats.dual_clip_frac);
  const double n = static_cast<double>(std::max<reco::index_t>(1, r.stats.policy_tokens));
  s.share = (1.0 + n / 10000) / n;
  return s;
}

// The result fields: every field in double for double inputs; for float inputs the fields made
// of per-token terms within the float bound, the entropy means within 8u (the CPU's packed pass
// adds the entropies in float blocks of 8, within 7u; the fused kernels in double), the others
// (counts, per-response values) as in double.
inline void expect_same_result(const reco::objective_result& f, const reco::objective_result& g,
                        const float_scales* fl = nullptr) {
  const double rel = fl ? 1e-5 : 1e-12, abs = fl ? 1e-7 : 1e-15;
  const double loss_abs = fl ? 1e-5 * fl->terms + 1e-9 : 1e-15, share = fl ? fl->share : 0.0;
  EXPECT_TRUE(close(f.loss, g.loss, "loss", rel, loss_abs));
  EXPECT_TRUE(close(f.policy_loss, g.policy_loss, "policy_loss", rel, loss_abs));
  EXPECT_TRUE(close(f.kl_loss, g.kl_loss, "kl_loss", rel, abs));
  EXPECT_TRUE(close(f.entropy_loss, g.entropy_loss, "entropy_loss", rel, abs));
  const auto &a = f.stats, &b = g.stats;
  EXPECT_TRUE(close(a.clip_frac, b.clip_frac, "clip_frac", rel, abs + share));
  EXPECT_TRUE(close(a.clip_frac_low, b.clip_frac_low, "clip_frac_low", rel, abs + share));
  EXPECT_TRUE(close(a.clip_frac_high, b.clip_frac_high, "clip_frac_high", rel, abs + share));
  EXPECT_TRUE(close(a.dual_clip_frac, b.dual_clip_frac, "dual_clip_frac", rel, abs + share));
  EXPECT_TRUE(close(a.ppo_kl, b.ppo_kl, "ppo_kl", rel, abs));
  EXPECT_TRUE(close(a.ratio_mean, b.ratio_mean, "ratio_mean", rel, abs));
  EXPECT_TRUE(close(a.ratio_min, b.ratio_min, "ratio_min", rel, abs));
  EXPECT_TRUE(close(a.ratio_max, b.ratio_max, "ratio_max", rel, abs));
  EXPECT_TRUE(close(a.ref_kl_mean, b.ref_kl_mean, "ref_kl_mean", rel, abs));
  const double h_rel = fl ? 8 * 0x1p-24 : 1e-12;
  EXPECT_TRUE(close(a.entropy_mean, b.entropy_mean, "entropy_mean", h_rel));
  EXPECT_TRUE(close(a.entropy_kept_mean, b.entropy_kept_mean, "entropy_kept_mean", h_rel));
  EXPECT_TRUE(close(a.kept_frac, b.kept_frac, "kept_frac"));
  EXPECT_TRUE(close(a.weight_mean, b.weight_mean, "weight_mean"));
  EXPECT_TRUE(close(a.weight_min, b.weight_min, "weight_min"));
  EXPECT_TRUE(close(a.weight_max, b.weight_max, "weight_max"));
  EXPECT_EQ(a.weight_cap_hits, b.weight_cap_hits);
  EXPECT_TRUE(close(a.zero_std_group_frac, b.zero_std_group_frac, "zero_std_group_frac"));
  EXPECT_TRUE(close(a.advantage_mean, b.advantage_mean, "advantage_mean"));
  EXPECT_TRUE(std::fabs(a.advantage_std - b.advantage_std) <= 1e-10 * (1 + b.advantage_std)) << "advantage_std";
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(close(a.token_variance[k], b.token_variance[k], "token_variance", rel, abs));
  EXPECT_EQ(a.valid_tokens, b.valid_tokens);
  EXPECT_EQ(a.policy_tokens, b.policy_tokens);
  EXPECT_EQ(a.nonempty_responses, b.nonempty_responses);
  EXPECT_EQ(f.status, g.status);
}

// The fused call's result and gradients against the generic call's.
template <class T>
void expect_same_call(const reco::objective_result& fused, const reco::objective_result& generic,
                      const std::vector<T>& g_fus, const std::vector<T>& g_gen, const std::vector<T>& gh_fus,
                      const std::vector<T>& gh_gen, bool entropy_gradient) {
  const std::size_t n = g_gen.size();
  if constexpr (std::is_same_v<T, double>) {
    expect_same_result(fused, generic);
    for (std::size_t t = 0; t < n; ++t) {
      ASSERT_TRUE(same_gradient(g_fus[t], g_gen[t])) << "token " << t;
      if (entropy_gradient) {
        ASSERT_TRUE(same_gradient(gh_fus[t], gh_gen[t])) << "entropy gradient, token " << t;
      }
    }
  } else {
    const float_scales fl = float_scales_of(g_gen, entropy_gradient ? gh_gen : std::vector<T>{}, generic);
    expect_same_result(fused, generic, &fl);
    const std::size_t allowed = 1 + n / 10000;
    std::size_t flipped = 0;
    for (std::size_t t = 0; t < n; ++t) {
      const auto c = close(g_fus[t], g_gen[t], "gradient", 1e-5, 1e-9 * fl.gmax);
      if (!c && ++flipped > allowed) FAIL() << "token " << t << ": " << c.message();
      if (entropy_gradient) {
        ASSERT_TRUE(close(gh_fus[t], gh_gen[t], "entropy gradient", 1e-5, 1e-9 * fl.hmax)) << "token " << t;
      }
    }
  }
}

}  // namespace fused_test
