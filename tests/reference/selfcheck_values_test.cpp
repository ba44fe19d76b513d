// Values of the reference checked against hand computations from the definitions: a GRPO loss
// on a two-group batch, every advantage estimator, every ratio form, the clip and dual clips,
// the aggregations and global normalisers, the KL estimators, the response weights (including
// the expected-count halving law), the 80/20 selection rules, the diagnostics, the on-policy
// identity, and the errors.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/ref_test_util.hpp"

namespace {

using namespace reco_ref;
using i64 = std::int64_t;

void expect_close(double actual, double expected, double rel = 1e-14) {
  EXPECT_NEAR(actual, expected, rel * (1 + std::fabs(expected)));
}

// A packed batch without gaps: responses given by their logp / old_logp; group sizes given.
// ref_logp = logp (d = 0), entropy = 1, rewards and advantages 0 unless set afterwards.
batch packed(const std::vector<std::vector<double>>& logp, const std::vector<std::vector<double>>& old,
             const std::vector<i64>& group_sizes) {
  batch b;
  for (std::size_t i = 0; i < logp.size(); ++i) {
    b.token_begin.push_back(static_cast<i64>(b.logp.size()));
    for (std::size_t k = 0; k < logp[i].size(); ++k) {
      b.logp.push_back(logp[i][k]);
      b.old_logp.push_back(old[i][k]);
    }
    b.token_end.push_back(static_cast<i64>(b.logp.size()));
    b.max_length = std::max<i64>(b.max_length, static_cast<i64>(logp[i].size()));
  }
  b.num_tokens = static_cast<i64>(b.logp.size());
  b.ref_logp = b.logp;
  b.entropy.assign(b.logp.size(), 1.0);
  b.rewards.assign(logp.size(), 0.0);
  b.advantages.assign(logp.size(), 0.0);
  b.group_offsets = {0};
  for (i64 g : group_sizes) b.group_offsets.push_back(b.group_offsets.back() + g);
  return b;
}

// One response, one token with advantage A (given), token_mean aggregation, no clip, no KL.
batch one_token(double logp, double old, double A) {
  batch b = packed({{logp}}, {{old}}, {1});
  b.advantages = {A};
  return b;
}

config bare(ratio form) {
  config c;
  c.adv = advantage::given;
  c.ratio_form = form;
  c.clip_mode = clip::none;
  c.agg = aggregation::token_mean;
  return c;
}

// ---------------------------------------------------------------------------------------------
// GRPO on a two-group batch, computed on paper.
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, GrpoTwoGroupsByHand) {
  // Group 0: responses 0 (2 tokens, reward 1) and 1 (1 token, reward 0).
  // Group 1: responses 2 (2 tokens, reward 1), 3 and 4 (1 token each, reward 0).
  const std::vector<double> r = {1.1, 1.5, 0.5, 0.7, 1.0, 4.0, 1.25};  // token ratios
  const std::vector<double> lp = {-0.5, -1.0, -2.0, -0.3, -1.5, -0.8, -0.1};
  const std::vector<double> d = {-0.1, 0.2, 0.05, -0.3, 0.0, 0.15, -0.05};  // logp - ref_logp
  std::vector<double> old(7), ref(7);
  for (int t = 0; t < 7; ++t) {
    old[t] = lp[t] - std::log(r[t]);
    ref[t] = lp[t] - d[t];
  }
  batch b = packed({{lp[0], lp[1]}, {lp[2]}, {lp[3], lp[4]}, {lp[5]}, {lp[6]}},
                   {{old[0], old[1]}, {old[2]}, {old[3], old[4]}, {old[5]}, {old[6]}}, {2, 3});
  b.ref_logp = ref;
  b.rewards = {1, 0, 1, 0, 0};
  const output o = evaluate(b, preset("grpo"));

  // Advantages: group 0 mean 1/2, std sqrt(1/2); group 1 mean 1/3, std sqrt(1/3).
  const double A0 = 0.5 / (std::sqrt(0.5) + 1e-6), A1 = -A0;
  const double A2 = (2.0 / 3) / (std::sqrt(1.0 / 3) + 1e-6), A3 = (-1.0 / 3) / (std::sqrt(1.0 / 3) + 1e-6);
  const double A4 = A3;
  expect_close(o.advantages[0], A0);
  expect_close(o.advantages[1], A1);
  expect_close(o.advantages[2], A2);
  expect_close(o.advantages[3], A3);
  expect_close(o.advantages[4], A4);

  // Per token: t0 unclipped; t1 clipped at 1.2 (A > 0); t2 clipped at 0.8 (A < 0); t3, t4
  // unclipped; t5 hard dual clip (-A*4 > -A*3); t6 unclipped (A < 0, ratio above 1).
  // seq_mean_token_mean with R' = 5: c = 1/10 for the 2-token responses, 1/5 for the others.
  const double policy = (1.0 / 10) * (-A0 * 1.1 - A0 * 1.2) + (1.0 / 5) * (-A1 * 0.8) +
                        (1.0 / 10) * (-A2 * 0.7 - A2 * 1.0) + (1.0 / 5) * (-A3 * 3) + (1.0 / 5) * (-A4 * 1.25);
  const double c[7] = {0.1, 0.1, 0.2, 0.1, 0.1, 0.2, 0.2};
  double kl = 0;
  for (int t = 0; t < 7; ++t) kl += 0.001 * c[t] * (std::exp(-d[t]) + d[t] - 1);
  expect_close(o.policy_loss, policy);
  expect_close(o.kl_loss, kl);
  expect_close(o.loss, policy + kl);
  EXPECT_EQ(o.entropy_loss, 0.0);

  const double g_policy[7] = {-A0 * 1.1 * 0.1, 0, 0, -A2 * 0.7 * 0.1, -A2 * 1.0 * 0.1, 0, -A4 * 1.25 * 0.2};
  for (int t = 0; t < 7; ++t) {
    expect_close(o.grad_logp[t], g_policy[t] + 0.001 * c[t] * (1 - std::exp(-d[t])));
  }

  EXPECT_DOUBLE_EQ(o.clip_frac, 2.0 / 7);
  EXPECT_DOUBLE_EQ(o.clip_frac_high, 1.0 / 7);
  EXPECT_DOUBLE_EQ(o.clip_frac_low, 1.0 / 7);
  EXPECT_DOUBLE_EQ(o.dual_clip_frac, 1.0 / 7);
  expect_close(o.ratio_mean, (1.1 + 1.5 + 0.5 + 0.7 + 1.0 + 4.0 + 1.25) / 7);
  expect_close(o.ratio_min, 0.5);
  expect_close(o.ratio_max, 4.0);
  double ppo_kl = 0, ref_kl = 0;
  for (int t = 0; t < 7; ++t) {
    ppo_kl += -std::log(r[t]) / 7;
    ref_kl += (std::exp(-d[t]) + d[t] - 1) / 7;
  }
  expect_close(o.ppo_kl, ppo_kl);
  expect_close(o.ref_kl_mean, ref_kl);
  EXPECT_EQ(o.kept_frac, 1.0);
  EXPECT_EQ(o.zero_std_group_frac, 0.0);
  expect_close(o.advantage_mean, (2 * A0 + A1 + 2 * A2 + A3 + A4) / 7);
  EXPECT_EQ(o.valid_tokens, 7);
  EXPECT_EQ(o.policy_tokens, 7);
  EXPECT_EQ(o.nonempty_responses, 5);
  EXPECT_EQ(o.weight_mean, 1.0);
  EXPECT_EQ(o.weight_cap_hits, 0);
}

// ---------------------------------------------------------------------------------------------
// Advantage estimators. Groups: rewards {2, 0, 1} | {5} (singleton) | {1, 1} (all equal), with
// valid lengths (2, 1, 3 | 2 | 1, 0).
// ---------------------------------------------------------------------------------------------

batch advantage_batch() {
  batch b = packed({{-1, -1}, {-1}, {-1, -1, -1}, {-1, -1}, {-1}, {}},
                   {{-1, -1}, {-1}, {-1, -1, -1}, {-1, -1}, {-1}, {}}, {3, 1, 2});
  b.rewards = {2, 0, 1, 5, 1, 1};
  return b;
}

std::vector<double> advantages_for(advantage a, singleton s, bool scale = true, bool unbiased = true) {
  config c = preset("grpo");
  c.adv = a;
  c.singleton_policy = s;
  c.scale_by_std = scale;
  c.whiten_unbiased = unbiased;
  const output o = evaluate(advantage_batch(), c);
  EXPECT_DOUBLE_EQ(o.zero_std_group_frac, 2.0 / 3);  // the singleton and {1, 1}
  return o.advantages;
}

void expect_all_close(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) expect_close(actual[i], expected[i]);
}

TEST(ReferenceValues, AdvantageGrpoAndDrGrpo) {
  const double e = 1e-6;  // group 0: mean 1, std 1
  expect_all_close(advantages_for(advantage::grpo, singleton::zero), {1 / (1 + e), -1 / (1 + e), 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::grpo, singleton::raw_score),
                   {1 / (1 + e), -1 / (1 + e), 0, 5 / (1 + e), 0, 0});
  expect_all_close(advantages_for(advantage::grpo, singleton::raw_score, false), {1, -1, 0, 5, 0, 0});
  expect_all_close(advantages_for(advantage::dr_grpo, singleton::zero), {1, -1, 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::dr_grpo, singleton::raw_score), {1, -1, 0, 5, 0, 0});
}

TEST(ReferenceValues, AdvantageBatchStdRlooOpoPassGpg) {
  const double e = 1e-6;
  const double sd = std::sqrt(46.0 / 15);  // unbiased std of {2, 0, 1, 5, 1, 1}
  expect_all_close(advantages_for(advantage::batch_std, singleton::zero), {1 / (sd + e), -1 / (sd + e), 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::batch_std, singleton::raw_score),
                   {1 / (sd + e), -1 / (sd + e), 0, 5 / (sd + e), 0, 0});
  expect_all_close(advantages_for(advantage::rloo, singleton::zero), {1.5, -1.5, 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::rloo, singleton::raw_score), {1.5, -1.5, 0, 5, 0, 0});
  // OPO: group 0 baseline (2*2 + 1*0 + 3*1) / 6 = 7/6; group 2 baseline (1*1 + 0*1) / 1 = 1.
  expect_all_close(advantages_for(advantage::opo, singleton::zero), {5.0 / 6, -7.0 / 6, -1.0 / 6, 0, 0, 0});
  // pass@k: group 0 best = index 0 (2), second = 1; group 2: best index 4, gap 0.
  expect_all_close(advantages_for(advantage::pass_at_k, singleton::zero), {1 / (1 + e), 0, 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::pass_at_k, singleton::raw_score), {1 / (1 + e), 0, 0, 5 / (1 + e), 0, 0});
  expect_all_close(advantages_for(advantage::pass_at_k, singleton::zero, false), {1, 0, 0, 0, 0, 0});
  // GPG: alpha = R / #nonzero = 6 / 5.
  expect_all_close(advantages_for(advantage::gpg, singleton::zero), {1.2, -1.2, 0, 0, 0, 0});
  expect_all_close(advantages_for(advantage::gpg, singleton::raw_score), {1.2, -1.2, 0, 6, 0, 0});
}

TEST(ReferenceValues, AdvantageReinforcePlusPlusWhitening) {
  // a = (1, -1, 0, 0, 0, 0), |o| = (2, 1, 3, 2, 1, 0): mu = 1/9, sum |o| (a - mu)^2 = 234/81.
  const double mu = 1.0 / 9;
  const double var_unbiased = (234.0 / 81) / 8, var_biased = (234.0 / 81) / 9;
  const std::vector<double> a = {1, -1, 0, 0, 0, 0};
  std::vector<double> eu, eb;
  for (double ai : a) {
    eu.push_back((ai - mu) / std::sqrt(var_unbiased + 1e-8));
    eb.push_back((ai - mu) / std::sqrt(var_biased + 1e-8));
  }
  expect_all_close(advantages_for(advantage::reinforce_pp, singleton::zero), eu);
  expect_all_close(advantages_for(advantage::reinforce_pp, singleton::zero, true, false), eb);
  // raw_score: the singleton's a_i = 5 joins the whitening. mu = (2 - 1 + 10) / 9 = 11/9.
  const std::vector<double> ar = {1, -1, 0, 5, 0, 0};
  const std::vector<double> len = {2, 1, 3, 2, 1, 0};
  const double mur = 11.0 / 9;
  double ss = 0;
  for (int i = 0; i < 6; ++i) ss += len[i] * (ar[i] - mur) * (ar[i] - mur);
  std::vector<double> er;
  for (double ai : ar) er.push_back((ai - mur) / std::sqrt(ss / 8 + 1e-8));
  expect_all_close(advantages_for(advantage::reinforce_pp, singleton::raw_score), er);
}

TEST(ReferenceValues, AdvantageGivenAndDiagnostics) {
  batch b = advantage_batch();
  b.advantages = {0.5, -1, 2, 3, -4, 7};
  config c = preset("grpo");
  c.adv = advantage::given;
  const output o = evaluate(b, c);
  expect_all_close(o.advantages, b.advantages);
  EXPECT_EQ(o.zero_std_group_frac, 0.0);  // reads no rewards
  // Over valid tokens (lengths 2, 1, 3, 2, 1, 0): mean and population std.
  const double mean = (2 * 0.5 - 1 + 3 * 2 + 2 * 3 - 4) / 9.0;
  const double var = (2 * (0.5 - mean) * (0.5 - mean) + (-1 - mean) * (-1 - mean) + 3 * (2 - mean) * (2 - mean) +
                      2 * (3 - mean) * (3 - mean) + (-4 - mean) * (-4 - mean)) / 9.0;
  expect_close(o.advantage_mean, mean);
  expect_close(o.advantage_std, std::sqrt(var));
  EXPECT_EQ(o.nonempty_responses, 5);
}

// ---------------------------------------------------------------------------------------------
// Ratio forms (one token unless stated; token_mean, no clip, given A).
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, TokenRatioAndLogClamp) {
  const double A = 0.7, r = std::exp(0.2);
  output o = evaluate(one_token(-1.0, -1.2, A), bare(ratio::token));
  expect_close(o.loss, -A * r);
  expect_close(o.grad_logp[0], -A * r);
  expect_close(o.ratio_mean, r);
  config c = bare(ratio::token);
  c.log_ratio_clamp = 0.1;  // the clamp bites: value at e^0.1, no gradient
  o = evaluate(one_token(-1.0, -1.2, A), c);
  expect_close(o.loss, -A * std::exp(0.1));
  EXPECT_EQ(o.grad_logp[0], 0.0);
}

TEST(ReferenceValues, VarianceRatio) {
  const double A = -0.6, lp = -0.4, old = -0.9;
  const double p = std::exp(lp), q = std::exp(old);
  const double x = p * (1 - p) / (q * (1 - q));
  const output o = evaluate(one_token(lp, old, A), bare(ratio::variance));
  expect_close(o.loss, -A * x, 1e-13);
  expect_close(o.grad_logp[0], -A * x, 1e-13);  // d/dlogp of p (1 - sg p) is p (1 - p)
  expect_close(o.ratio_mean, x, 1e-13);
}

TEST(ReferenceValues, VarianceRatioNearCertainTokensStayFinite) {
  // p_old -> 1: p_old (1 - p_old) is floored at 1e-12 and the log ratio clamped at 20.
  config c = bare(ratio::variance);
  output o = evaluate(one_token(-0.5, 0.0, 1.0), c);
  EXPECT_TRUE(std::isfinite(o.loss));
  expect_close(o.loss, -std::exp(20.0));
  EXPECT_EQ(o.grad_logp[0], 0.0);
  o = evaluate(one_token(0.0, 0.0, 1.0), c);  // both floored: x = 1
  expect_close(o.loss, -1.0);
  o = evaluate(one_token(-1e-300, -1e-300, 1.0), c);
  expect_close(o.loss, -1.0);
  // Just below 1 the variance is resolved through expm1: p = exp(-1e-9), p (1 - p) ~ 1e-9.
  const double lp = -1e-9, old = -2e-9;
  o = evaluate(one_token(lp, old, 1.0), c);
  expect_close(o.loss, -(std::exp(lp) * -std::expm1(lp)) / (std::exp(old) * -std::expm1(old)), 1e-12);
  expect_close(o.loss, -0.5, 1e-8);
  // Under the PPO clip with the hard dual clip the result is finite as well.
  c.clip_mode = clip::ppo;
  c.dual_mode = dual::hard;
  o = evaluate(one_token(-0.5, 0.0, -1.0), c);
  expect_close(o.loss, 3.0);
  EXPECT_EQ(o.grad_logp[0], 0.0);
}

TEST(ReferenceValues, SequenceRatio) {
  // Two tokens with l = 0.1 and 0.3: s = 0.2, both tokens see x = e^0.2.
  const double A = 0.9;
  batch b = packed({{-1.0, -2.0}}, {{-1.1, -2.3}}, {1});
  b.advantages = {A};
  output o = evaluate(b, bare(ratio::sequence));
  expect_close(o.loss, -A * std::exp(0.2), 1e-13);
  expect_close(o.grad_logp[0], -A * std::exp(0.2) / 2, 1e-13);
  expect_close(o.grad_logp[1], -A * std::exp(0.2) / 2, 1e-13);
  config c = bare(ratio::sequence);
  c.seq_max_log = 0.15;  // the cap bites: value e^0.15, no gradient
  o = evaluate(b, c);
  expect_close(o.loss, -A * std::exp(0.15));
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.grad_logp[1], 0.0);
  // GSPO's tiny clip range: x = e^0.2 > 1 + 4e-4 with A > 0 is clipped.
  o = evaluate(b, [] {
    config g = preset("gspo");
    g.adv = advantage::given;
    return g;
  }());
  expect_close(o.loss, -A * (1 + 4e-4) * (0.5 + 0.5));  // seq_mean_token_mean over one response
  EXPECT_EQ(o.clip_frac, 1.0);
}

TEST(ReferenceValues, FlippedRatio) {
  const double r = std::exp(0.1);
  // A > 0: value -A / r, gradient weight 1 / r.
  output o = evaluate(one_token(-1.0, -1.1, 0.7), bare(ratio::flipped));
  expect_close(o.loss, -0.7 / r);
  expect_close(o.grad_logp[0], -0.7 / r);
  // A < 0: the token ratio.
  o = evaluate(one_token(-1.0, -1.1, -0.7), bare(ratio::flipped));
  expect_close(o.loss, 0.7 * r);
  expect_close(o.grad_logp[0], 0.7 * r);
  // flipped_all: reciprocal for A < 0 too.
  o = evaluate(one_token(-1.0, -1.1, -0.7), bare(ratio::flipped_all));
  expect_close(o.loss, 0.7 / r);
  expect_close(o.grad_logp[0], 0.7 / r);
  // Clipped (A > 0, r = 1.5 > 1.2): value -A / 1.2, no gradient.
  config c = bare(ratio::flipped);
  c.clip_mode = clip::ppo;
  o = evaluate(one_token(-1.0, -1.0 - std::log(1.5), 0.7), c);
  expect_close(o.loss, -0.7 / 1.2);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.clip_frac_high, 1.0);
}

TEST(ReferenceValues, GmpoRatio) {
  // A > 0, l = (0.1, 0.6): m = (0.1, 0.4), x = e^0.25; token 1 is clipped by the form.
  batch b = packed({{-1.0, -1.0}}, {{-1.1, -1.6}}, {1});
  b.advantages = {0.8};
  output o = evaluate(b, bare(ratio::gmpo));
  const double x = std::exp(0.25);
  expect_close(o.loss, -0.8 * x, 1e-13);
  expect_close(o.grad_logp[0], -0.8 * x / 2, 1e-13);
  EXPECT_EQ(o.grad_logp[1], 0.0);
  EXPECT_EQ(o.clip_frac, 0.5);
  EXPECT_EQ(o.clip_frac_high, 0.5);
  // A < 0, l = (-0.6, 0.2): m = (-0.4, 0.2), x = e^-0.1; token 0 is clipped by the form.
  b = packed({{-1.0, -1.0}}, {{-0.4, -1.2}}, {1});
  b.advantages = {-0.8};
  o = evaluate(b, bare(ratio::gmpo));
  const double y = std::exp(-0.1);
  expect_close(o.loss, 0.8 * y, 1e-13);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  expect_close(o.grad_logp[1], 0.8 * y / 2, 1e-13);
  EXPECT_EQ(o.clip_frac_low, 0.5);
}

TEST(ReferenceValues, ReinforceCispoSapo) {
  const double A = 0.7, lp = -1.0, r = std::exp(0.2);
  output o = evaluate(one_token(lp, -1.2, A), bare(ratio::reinforce));
  expect_close(o.loss, -A * lp);
  expect_close(o.grad_logp[0], -A);
  expect_close(o.ratio_mean, r);

  o = evaluate(one_token(lp, -1.2, A), bare(ratio::cispo));  // r inside [0, 6]
  expect_close(o.loss, -r * A * lp);
  expect_close(o.grad_logp[0], -A * r);
  EXPECT_EQ(o.clip_frac, 0.0);
  config c = bare(ratio::cispo);
  c.cispo_eps_low = 0.1;
  c.cispo_eps_high = 0.1;  // r = 1.22 > 1.1: weight 1.1, counted as clipped, gradient kept
  o = evaluate(one_token(lp, -1.2, A), c);
  expect_close(o.loss, -1.1 * A * lp);
  expect_close(o.grad_logp[0], -A * 1.1);
  EXPECT_EQ(o.clip_frac, 1.0);

  // SAPO: A > 0 uses tau = 1, A < 0 tau = 1.05.
  const double s1 = 1 / (1 + std::exp(-(r - 1)));
  o = evaluate(one_token(lp, -1.2, A), bare(ratio::sapo));
  expect_close(o.loss, -s1 * 4 * A);
  expect_close(o.grad_logp[0], -4 * A * s1 * (1 - s1) * r);
  const double s2 = 1 / (1 + std::exp(-1.05 * (r - 1)));
  o = evaluate(one_token(lp, -1.2, -A), bare(ratio::sapo));
  expect_close(o.loss, s2 * (4 / 1.05) * A);
  expect_close(o.grad_logp[0], 4 * A * s2 * (1 - s2) * r);
}

// ---------------------------------------------------------------------------------------------
// Clip, dual clips, entropy split.
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, PpoClipAsymmetric) {
  config c = bare(ratio::token);
  c.clip_mode = clip::ppo;
  c.eps_low = 0.1;
  c.eps_high = 0.3;
  // A > 0, r = 1.25 < 1.3: unclipped.
  output o = evaluate(one_token(-1.0, -1.0 - std::log(1.25), 1.0), c);
  expect_close(o.loss, -1.25);
  expect_close(o.grad_logp[0], -1.25);
  EXPECT_EQ(o.clip_frac, 0.0);
  // A < 0, r = 0.85 < 0.9: clipped at 0.9.
  o = evaluate(one_token(-1.0, -1.0 - std::log(0.85), -1.0), c);
  expect_close(o.loss, 0.9);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.clip_frac_low, 1.0);
  // A = 0: never clipped, loss and gradient 0.
  o = evaluate(one_token(-1.0, -1.0 - std::log(3.0), 0.0), c);
  EXPECT_EQ(o.loss, 0.0);
  EXPECT_EQ(o.clip_frac, 0.0);
}

TEST(ReferenceValues, DualClips) {
  const double lp = -1.0, old4 = -1.0 - std::log(4.0);
  config c = bare(ratio::token);
  c.clip_mode = clip::ppo;
  c.dual_mode = dual::hard;
  c.dual_c = 3;
  // Hard: A < 0, r = 4: loss capped at -A*3, no gradient.
  output o = evaluate(one_token(lp, old4, -0.5), c);
  expect_close(o.loss, 0.5 * 3);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.dual_clip_frac, 1.0);
  EXPECT_EQ(o.clip_frac, 0.0);
  // Hard, A > 0 with r = 0.25: no dual clip (only A < 0).
  o = evaluate(one_token(lp, -1.0 - std::log(0.25), 0.5), c);
  expect_close(o.loss, -0.5 * 0.25);
  EXPECT_EQ(o.dual_clip_frac, 0.0);
  // Soft: A < 0, r = 4 > c: loss -A*c*logp, gradient -A*c.
  c.dual_mode = dual::soft;
  o = evaluate(one_token(lp, old4, -0.5), c);
  expect_close(o.loss, 0.5 * 3 * lp);
  expect_close(o.grad_logp[0], 0.5 * 3);
  EXPECT_EQ(o.dual_clip_frac, 1.0);
  // Soft with the flipped ratio, A > 0, r = 0.25: weight 1/r = 4 > 3.
  c.ratio_form = ratio::flipped;
  o = evaluate(one_token(lp, -1.0 - std::log(0.25), 0.5), c);
  expect_close(o.loss, -0.5 * 3 * lp);
  expect_close(o.grad_logp[0], -0.5 * 3);
  EXPECT_EQ(o.dual_clip_frac, 1.0);
  // The same token without the dual clip: value -A / r, gradient -A / r.
  c.dual_mode = dual::off;
  o = evaluate(one_token(lp, -1.0 - std::log(0.25), 0.5), c);
  expect_close(o.loss, -0.5 * 4);
  expect_close(o.grad_logp[0], -0.5 * 4);
}

TEST(ReferenceValues, EntropySplitClip) {
  // Entropies (0.1, 0.5, 0.9, 1.3, 2.0, 3.0): 0.8-quantile at pos 4 = 2.0; only H = 3.0 is above
  // it and uses eps 0.4. Tokens 4 and 5 have r = 1.3 with A > 0.
  const double l13 = std::log(1.3);
  batch b = packed({{-1, -1, -1, -1, -1, -1}}, {{-1, -1, -1, -1, -1 - l13, -1 - l13}}, {1});
  b.entropy = {0.1, 0.5, 0.9, 1.3, 2.0, 3.0};
  b.advantages = {1.0};
  config c = bare(ratio::token);
  c.clip_mode = clip::entropy_split;
  output o = evaluate(b, c);
  expect_close(o.grad_logp[4], 0.0);           // clipped at 1.2
  expect_close(o.grad_logp[5], -1.3 / 6);      // 1.3 < 1.4: unclipped
  expect_close(o.loss, -(4 * 1.0 + 1.2 + 1.3) / 6);
  EXPECT_DOUBLE_EQ(o.clip_frac, 1.0 / 6);
  // Interpolated quantile: entropies (1, 2, 3, 4, 5): pos 3.2 gives 4.2; only H = 5 is above.
  b = packed({{-1, -1, -1, -1, -1}}, {{-1, -1, -1, -1 - l13, -1 - l13}}, {1});
  b.entropy = {1, 2, 3, 4, 5};
  b.advantages = {1.0};
  o = evaluate(b, c);
  EXPECT_EQ(o.grad_logp[3], 0.0);
  expect_close(o.grad_logp[4], -1.3 / 5);
}

// ---------------------------------------------------------------------------------------------
// Aggregation coefficients: with the REINFORCE surrogate and A = 1, grad_t = -c_t exactly.
// Responses: 2 valid tokens; empty; 3 valid tokens and one masked (4 in range). R = 3, T = 4.
// ---------------------------------------------------------------------------------------------

batch aggregation_batch() {
  batch b = packed({{-1, -2}, {}, {-1, -2, -3, -4}}, {{-1, -2}, {}, {-1, -2, -3, -4}}, {3});
  b.mask = {1, 1, 1, 0, 1, 1};
  b.logp[3] = std::numeric_limits<double>::quiet_NaN();  // masked: never read
  b.advantages = {1, 1, 1};
  return b;
}

std::vector<double> coefficients(const config& c) {
  const output o = evaluate(aggregation_batch(), c);
  std::vector<double> out;
  for (double g : o.grad_logp) out.push_back(-g);
  return out;
}

// The peers' switches and loss types (docs/peers.md), on paper.
TEST(ReferenceValues, PeersByHand) {
  const double lp = -1.0;
  auto with_ratio = [&](double r, double A) { return one_token(lp, lp - std::log(r), A); };
  // TRL's delta: loss -min(A min(r, delta), A clip(r, 0.8, 1.2)).
  config c = bare(ratio::token);
  c.clip_mode = clip::ppo;
  c.delta = 1.5;
  output o = evaluate(with_ratio(4.0, -0.5), c);  // A < 0 beyond delta: -A delta, no gradient
  expect_close(o.loss, 0.5 * 1.5);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.dual_clip_frac, 1.0);
  EXPECT_EQ(o.clip_frac, 0.0);
  o = evaluate(with_ratio(1.3, -0.5), c);  // between 1 + eps_high and delta: -A r, gradient -A r
  expect_close(o.loss, 0.5 * 1.3);
  expect_close(o.grad_logp[0], 0.5 * 1.3);
  EXPECT_EQ(o.dual_clip_frac, 0.0);
  c.delta = 1.1;  // below 1 + eps_high: it caps A > 0 too
  o = evaluate(with_ratio(1.15, 0.5), c);
  expect_close(o.loss, -0.5 * 1.1);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.dual_clip_frac, 1.0);
  o = evaluate(with_ratio(1.15, -0.5), c);  // A < 0 keeps r inside the clip range
  expect_close(o.loss, 0.5 * 1.15);
  expect_close(o.grad_logp[0], 0.5 * 1.15);
  o = evaluate(with_ratio(1.4, -0.5), c);  // A < 0 past 1 + eps_high: -A (1 + eps_high), constant
  expect_close(o.loss, 0.5 * 1.2);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  EXPECT_EQ(o.dual_clip_frac, 1.0);

  // The importance-weighted KL: k1 at d = 0.2 times r = e^0.5, with its product-rule gradient.
  c = bare(ratio::reinforce);
  c.kl_mode = kl::k1;
  c.kl_beta = 1;
  c.kl_importance_weighted = true;
  batch b = one_token(-1.0, -1.5, 0.0);
  b.ref_logp = {-1.2};
  o = evaluate(b, c);
  expect_close(o.kl_loss, 0.2 * std::exp(0.5), 1e-13);
  expect_close(o.grad_logp[0], (1 + 0.2) * std::exp(0.5), 1e-13);

  // VESPO: log w = 0.3 - 0.1 over the response's two tokens; phi = e^lambda w^k e^(-lambda w).
  c = bare(ratio::vespo);
  b = packed({{-1.0, -2.0}}, {{-1.3, -1.9}}, {1});
  for (double A : {1.0, -1.0}) {
    b.advantages = {A};
    const double w = std::exp(0.2), k = A > 0 ? 2 : 3, lam = A > 0 ? 3 : 2;
    const double phi = std::exp(lam) * std::pow(w, k) * std::exp(-lam * w);
    o = evaluate(b, c);
    expect_close(o.loss, -phi * A * (-1.0 - 2.0) / 2, 1e-13);
    expect_close(o.grad_logp[0], -phi * A / 2, 1e-13);
    expect_close(o.grad_logp[1], -phi * A / 2, 1e-13);
    expect_close(o.ratio_mean, w, 1e-13);
    EXPECT_EQ(o.clip_frac, 0.0);
  }
}

TEST(ReferenceValues, AggregationCoefficients) {
  config c = bare(ratio::reinforce);
  expect_all_close(coefficients(c), {1.0 / 5, 1.0 / 5, 1.0 / 5, 0, 1.0 / 5, 1.0 / 5});
  c.agg = aggregation::seq_mean_token_mean;  // R' = 2
  expect_all_close(coefficients(c), {1.0 / 4, 1.0 / 4, 1.0 / 6, 0, 1.0 / 6, 1.0 / 6});
  c.agg = aggregation::seq_mean_token_sum;
  expect_all_close(coefficients(c), {0.5, 0.5, 0.5, 0, 0.5, 0.5});
  c.agg = aggregation::seq_mean_token_sum_all;  // R = 3, the empty response included (LUSPO)
  expect_all_close(coefficients(c), {1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 1.0 / 3});
  c.agg = aggregation::seq_mean_token_sum_norm;  // C = R * T = 3 * 4
  expect_all_close(coefficients(c), {1.0 / 12, 1.0 / 12, 1.0 / 12, 0, 1.0 / 12, 1.0 / 12});
  c.sum_norm_max_length = 10;  // C = 30
  expect_all_close(coefficients(c), {1.0 / 30, 1.0 / 30, 1.0 / 30, 0, 1.0 / 30, 1.0 / 30});
  c.sum_norm_constant = 7;
  expect_all_close(coefficients(c), {1.0 / 7, 1.0 / 7, 1.0 / 7, 0, 1.0 / 7, 1.0 / 7});
  // The loss is the same sum: sum_t c_t * (-A * logp_t).
  const output o = evaluate(aggregation_batch(), c);
  expect_close(o.loss, (1 + 2 + 1 + 3 + 4) / 7.0);
  // A zero divisor makes the coefficient 0.
  batch b = aggregation_batch();
  b.max_length = 0;
  c.sum_norm_constant = 0;
  c.sum_norm_max_length = 0;
  EXPECT_EQ(evaluate(b, c).loss, 0.0);
}

TEST(ReferenceValues, GlobalNormalisers) {
  config c = bare(ratio::reinforce);
  c.norm_tokens = 50;
  expect_all_close(coefficients(c), {1.0 / 50, 1.0 / 50, 1.0 / 50, 0, 1.0 / 50, 1.0 / 50});
  c.agg = aggregation::seq_mean_token_mean;
  c.norm_responses = 8;
  expect_all_close(coefficients(c), {1.0 / 16, 1.0 / 16, 1.0 / 24, 0, 1.0 / 24, 1.0 / 24});
  c.agg = aggregation::seq_mean_token_sum;
  expect_all_close(coefficients(c), {1.0 / 8, 1.0 / 8, 1.0 / 8, 0, 1.0 / 8, 1.0 / 8});
}

// Split along a group boundary with the global normalisers of the whole batch, the two halves'
// losses and gradients add up to those of the whole (conventions: Aggregation).
TEST(ReferenceValues, GlobalNormalisersMakeSplitsAdd) {
  const batch whole = reco_ref_test::random_batch(4242, reco_ref_test::shape_for_seed(4));
  const i64 P = static_cast<i64>(whole.group_offsets.size()) - 1;
  const i64 split_group = P / 2, split_response = whole.group_offsets[static_cast<std::size_t>(split_group)];
  const i64 split_token = whole.token_begin[static_cast<std::size_t>(split_response)];
  auto part = [&](bool first) {
    batch b;
    const i64 r0 = first ? 0 : split_response, r1 = first ? split_response : static_cast<i64>(whole.rewards.size());
    const i64 t0 = first ? 0 : split_token, t1 = first ? split_token : whole.num_tokens;
    for (i64 i = r0; i < r1; ++i) {
      b.token_begin.push_back(whole.token_begin[static_cast<std::size_t>(i)] - t0);
      b.token_end.push_back(whole.token_end[static_cast<std::size_t>(i)] - t0);
      b.rewards.push_back(whole.rewards[static_cast<std::size_t>(i)]);
      b.advantages.push_back(whole.advantages[static_cast<std::size_t>(i)]);
    }
    auto slice = [&](const std::vector<double>& v) { return std::vector<double>(v.begin() + t0, v.begin() + t1); };
    b.logp = slice(whole.logp);
    b.old_logp = slice(whole.old_logp);
    b.ref_logp = slice(whole.ref_logp);
    b.entropy = slice(whole.entropy);
    if (!whole.mask.empty()) b.mask = std::vector<std::uint8_t>(whole.mask.begin() + t0, whole.mask.begin() + t1);
    if (!whole.token_weights.empty()) b.token_weights = slice(whole.token_weights);
    b.num_tokens = t1 - t0;
    b.max_length = whole.max_length;
    b.group_offsets = {0};
    for (i64 g = first ? 0 : split_group; g < (first ? split_group : P); ++g) {
      b.group_offsets.push_back(b.group_offsets.back() + whole.group_offsets[static_cast<std::size_t>(g + 1)] -
                                whole.group_offsets[static_cast<std::size_t>(g)]);
    }
    return b;
  };
  const batch a = part(true), z = part(false);
  for (aggregation agg : {aggregation::token_mean, aggregation::seq_mean_token_mean, aggregation::seq_mean_token_sum}) {
    config c = preset("reco");
    c.adv = advantage::given;
    c.agg = agg;
    c.entropy_bonus = true;
    const output ow = evaluate(whole, c);
    c.norm_tokens = ow.valid_tokens;
    c.norm_responses = ow.nonempty_responses;
    const output oa = evaluate(a, c), oz = evaluate(z, c);
    expect_close(oa.loss + oz.loss, ow.loss, 1e-13);
    for (i64 t = 0; t < whole.num_tokens; ++t) {
      const double g = t < split_token ? oa.grad_logp[static_cast<std::size_t>(t)]
                                       : oz.grad_logp[static_cast<std::size_t>(t - split_token)];
      EXPECT_EQ(g, ow.grad_logp[static_cast<std::size_t>(t)]) << "token " << t;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// KL estimators and the entropy bonus (one token, A = 0, beta = 1, coefficient 1).
// ---------------------------------------------------------------------------------------------

output kl_at(double d, kl mode, bool clamp = true, bool straight = false) {
  batch b = one_token(-1.0, -1.0, 0.0);
  b.ref_logp = {-1.0 - d};
  config c = bare(ratio::token);
  c.kl_mode = mode;
  c.kl_beta = 1;
  c.kl_clamp = clamp;
  c.kl_straight_through = straight;
  return evaluate(b, c);
}

TEST(ReferenceValues, KlEstimators) {
  output o = kl_at(0.3, kl::k1);
  expect_close(o.kl_loss, 0.3);
  expect_close(o.grad_logp[0], 1.0);
  expect_close(o.ref_kl_mean, 0.3);
  o = kl_at(-0.3, kl::abs);
  expect_close(o.kl_loss, 0.3);
  expect_close(o.grad_logp[0], -1.0);
  o = kl_at(0.0, kl::abs);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  o = kl_at(0.3, kl::k2);
  expect_close(o.kl_loss, 0.045);
  expect_close(o.grad_logp[0], 0.3);
  o = kl_at(0.3, kl::k3);
  expect_close(o.kl_loss, std::exp(-0.3) + 0.3 - 1);
  expect_close(o.grad_logp[0], 1 - std::exp(-0.3));
  EXPECT_EQ(o.loss, o.kl_loss);
  EXPECT_EQ(o.policy_loss, 0.0);
}

TEST(ReferenceValues, KlK3ClampsAndStraightThrough) {
  // d = -3: e^3 - 3 - 1 = 16.09 > 10: clamped, no gradient.
  output o = kl_at(-3, kl::k3);
  expect_close(o.kl_loss, 10);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  o = kl_at(-3, kl::k3, false);
  expect_close(o.kl_loss, std::exp(3.0) - 4);
  expect_close(o.grad_logp[0], 1 - std::exp(3.0));
  // d = -25: the exponent is clamped to 20 (value then clamped to 10).
  o = kl_at(-25, kl::k3);
  expect_close(o.kl_loss, 10);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  // d = 15: e^-15 + 14 > 10: clamped.
  o = kl_at(15, kl::k3);
  expect_close(o.kl_loss, 10);
  EXPECT_EQ(o.grad_logp[0], 0.0);
  // d = 8: k = e^-8 + 7 < 10: not clamped.
  o = kl_at(8, kl::k3);
  expect_close(o.kl_loss, std::exp(-8.0) + 7);
  expect_close(o.grad_logp[0], 1 - std::exp(-8.0));
  // Straight-through: the value of the estimator, the gradient d.
  o = kl_at(0.3, kl::k3, true, true);
  expect_close(o.kl_loss, std::exp(-0.3) + 0.3 - 1);
  expect_close(o.grad_logp[0], 0.3);
  o = kl_at(0.3, kl::k1, true, true);
  expect_close(o.kl_loss, 0.3);
  expect_close(o.grad_logp[0], 0.3);
  o = kl_at(-3, kl::k3, true, true);
  expect_close(o.kl_loss, 10);
  expect_close(o.grad_logp[0], -3);
}

TEST(ReferenceValues, KlAndEntropyUseValidCountsAndIgnoreTokenWeights) {
  // seq_mean_token_mean, 2 responses (2 and 3 valid tokens); token weights only scale the policy.
  batch b = aggregation_batch();
  b.ref_logp = {-1.5, -2, -1, -0.0, -3.5, -4};
  b.ref_logp[3] = std::numeric_limits<double>::quiet_NaN();
  b.entropy = {0.5, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), 2.5, 3.0};
  b.token_weights = {2, 2, 2, std::numeric_limits<double>::quiet_NaN(), 2, 2};
  config c = bare(ratio::reinforce);
  c.agg = aggregation::seq_mean_token_mean;
  c.kl_mode = kl::k2;
  c.kl_beta = 0.1;
  c.entropy_bonus = true;
  c.entropy_coef = 0.01;
  const output o = evaluate(b, c);
  const double coef[6] = {0.25, 0.25, 1.0 / 6, 0, 1.0 / 6, 1.0 / 6};
  const double d[6] = {0.5, 0, 0, 0, 0.5, 0};
  double kl_loss = 0, ent = 0, pol = 0;
  for (int t = 0; t < 6; ++t) {
    if (t == 3) continue;
    kl_loss += 0.1 * coef[t] * d[t] * d[t] / 2;
    ent += -0.01 * coef[t] * b.entropy[t];
    pol += coef[t] * 2 * (-1.0 * b.logp[t]);
    expect_close(o.grad_logp[t], coef[t] * 2 * -1.0 + 0.1 * coef[t] * d[t]);
    expect_close(o.grad_entropy[t], -0.01 * coef[t]);
  }
  expect_close(o.kl_loss, kl_loss);
  expect_close(o.entropy_loss, ent);
  expect_close(o.policy_loss, pol);
  EXPECT_EQ(o.grad_logp[3], 0.0);
  EXPECT_EQ(o.grad_entropy[3], 0.0);
  expect_close(o.entropy_mean, (0.5 + 1.0 + 1.5 + 2.5 + 3.0) / 5);
}

// ---------------------------------------------------------------------------------------------
// Response weights.
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, ExpectedCountWeightByHand) {
  // Group of 3 (one empty): w_i = 1 / (3 * exp(mean old_logp)).
  batch b = packed({{-1, -1}, {-1}, {}}, {{-0.2, -0.6}, {-3.0}, {}}, {3});
  b.advantages = {1, 1, 1};
  config c = bare(ratio::token);
  c.weight_mode = weight::expected_count;
  c.weight_cap = 0;
  output o = evaluate(b, c);
  expect_close(o.weights[0], 1 / (3 * std::exp(-0.4)));
  expect_close(o.weights[1], 1 / (3 * std::exp(-3.0)));
  EXPECT_EQ(o.weights[2], 0.0);
  EXPECT_EQ(o.weight_cap_hits, 0);
  expect_close(o.weight_mean, (o.weights[0] + o.weights[1]) / 2);
  expect_close(o.weight_min, o.weights[0]);
  expect_close(o.weight_max, o.weights[1]);
  // Cap 5: w_1 = e^3 / 3 = 6.7 is capped.
  c.weight_cap = 5;
  o = evaluate(b, c);
  expect_close(o.weights[1], 5);
  EXPECT_EQ(o.weight_cap_hits, 1);
  // Normalised to mean 1 over the non-empty responses of the group.
  c.weight_normalisation = weight_norm::group_mean;
  o = evaluate(b, c);
  const double w0 = 1 / (3 * std::exp(-0.4));
  expect_close(o.weights[0], 2 * w0 / (w0 + 5));
  expect_close(o.weights[1], 2 * 5 / (w0 + 5));
  EXPECT_EQ(o.weights[2], 0.0);
  expect_close(o.weight_mean, 1.0);
}

TEST(ReferenceValues, ExpectedCountHalvesWhenGeometricMeanOldProbabilityDoubles) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    batch b = reco_ref_test::random_batch(seed + 900, reco_ref_test::shape_for_seed(seed));
    config c = preset("reco_no_cap");
    const output before = evaluate(b, c);
    // Double pi_bar_old of every response i with i % 3 == 0: add log 2 to each of its old_logp.
    const std::vector<i64> owner = reco_ref_test::owners(b);
    for (i64 t = 0; t < b.num_tokens; ++t) {
      if (owner[static_cast<std::size_t>(t)] >= 0 && owner[static_cast<std::size_t>(t)] % 3 == 0) {
        b.old_logp[static_cast<std::size_t>(t)] += std::log(2.0);
      }
    }
    const output after = evaluate(b, c);
    for (std::size_t i = 0; i < after.weights.size(); ++i) {
      if (before.weights[i] == 0) continue;  // empty response
      expect_close(after.weights[i], before.weights[i] * (i % 3 == 0 ? 0.5 : 1.0), 1e-13);
    }
  }
}

TEST(ReferenceValues, WeightsScaleThePolicyTermOnly) {
  const batch b = reco_ref_test::random_batch(77, reco_ref_test::shape_for_seed(3));
  config uniform_cfg = preset("reco_token_only");  // KL on
  config weighted = preset("reco");
  const output u = evaluate(b, uniform_cfg), w = evaluate(b, weighted);
  expect_close(u.kl_loss, w.kl_loss, 0);
  uniform_cfg.kl_mode = kl::none;
  weighted.kl_mode = kl::none;
  const output u2 = evaluate(b, uniform_cfg), w2 = evaluate(b, weighted);
  const std::vector<i64> owner = reco_ref_test::owners(b);
  for (i64 t = 0; t < b.num_tokens; ++t) {
    const i64 i = owner[static_cast<std::size_t>(t)];
    if (i < 0) continue;
    expect_close(w2.grad_logp[static_cast<std::size_t>(t)],
                 w.weights[static_cast<std::size_t>(i)] * u2.grad_logp[static_cast<std::size_t>(t)], 1e-13);
  }
}

TEST(ReferenceValues, CallerWeightsCapAndBatchNormalisation) {
  batch b = packed({{-1}, {-1}, {-1}, {}}, {{-1}, {-1}, {-1}, {}}, {2, 2});
  b.advantages = {1, 1, 1, 1};
  b.response_weights = {1, 3, 30, 9};
  config c = bare(ratio::token);
  c.weight_mode = weight::caller;
  c.weight_cap = 10;
  output o = evaluate(b, c);
  expect_all_close(o.weights, {1, 3, 10, 0});
  EXPECT_EQ(o.weight_cap_hits, 1);
  c.weight_normalisation = weight_norm::batch_mean;  // 3 non-empty, sum 14
  o = evaluate(b, c);
  expect_all_close(o.weights, {3.0 / 14, 9.0 / 14, 30.0 / 14, 0});
  expect_close(o.loss, -(3.0 + 9.0 + 30.0) / 14 / 3);  // token_mean over 3 tokens, A = 1, r = 1
}

// ---------------------------------------------------------------------------------------------
// Token selection (80/20).
// ---------------------------------------------------------------------------------------------

std::vector<std::uint8_t> kept_for(const batch& b, selection s, double rho) {
  config c = bare(ratio::token);
  c.select = s;
  c.rho = rho;
  return evaluate(b, c).kept;
}

batch entropy_batch(const std::vector<double>& h) {
  std::vector<double> lp(h.size(), -1.0);
  batch b = packed({lp}, {lp}, {1});
  b.entropy = h;
  b.advantages = {1};
  return b;
}

TEST(ReferenceValues, TopKBreaksTiesByPosition) {
  // k = ceil(0.2 * 10) = 2; the cut is 0.9 (three tokens); the first two in position order stay.
  const batch b = entropy_batch({0.5, 0.9, 0.7, 0.9, 0.9, 0.1, 0.2, 0.3, 0.4, 0.6});
  EXPECT_EQ(kept_for(b, selection::top_k, 0.2), (std::vector<std::uint8_t>{0, 1, 0, 1, 0, 0, 0, 0, 0, 0}));
  // Quantile at q = 0.8: sorted, pos 7.2 between two 0.9s gives 0.9; every tie is kept.
  EXPECT_EQ(kept_for(b, selection::quantile, 0.2), (std::vector<std::uint8_t>{0, 1, 0, 1, 1, 0, 0, 0, 0, 0}));
  // One strictly above the cut, then ties: k = ceil(0.3 * 10) = 3, cut 0.9, one above (1.5).
  const batch b2 = entropy_batch({0.9, 0.2, 1.5, 0.9, 0.9, 0.1, 0.9, 0.3, 0.4, 0.6});
  EXPECT_EQ(kept_for(b2, selection::top_k, 0.3), (std::vector<std::uint8_t>{1, 0, 1, 1, 0, 0, 0, 0, 0, 0}));
}

TEST(ReferenceValues, TopKCountIsTheExactCeiling) {
  // rho N lands a hair above an integer in floating point: 0.55 * 100 = 55.00000000000001 and
  // 0.55 * 180 = 99.00000000000001; the count is the exact ceiling, 55 and 99 (not 56, 100).
  ASSERT_GT(0.55 * 100, 55.0);
  ASSERT_GT(0.55 * 180, 99.0);
  for (const auto& rn : std::vector<std::pair<double, int>>{{0.55, 180}, {0.55, 100}, {0.2, 7}, {0.2, 3}, {0.2, 1},
                                                            {1e-9, 40}, {0.2, 10}}) {
    std::vector<double> h;
    for (int t = 0; t < rn.second; ++t) h.push_back(std::fmod(t * 0.618034, 1.0) + t * 1e-3);  // distinct
    const std::vector<std::uint8_t> kept = kept_for(entropy_batch(h), selection::top_k, rn.first);
    int count = 0;
    for (auto k : kept) count += k;
    const int expected = rn.second == 180 ? 99 : rn.second == 100 ? 55 : rn.second == 7 ? 2 : rn.second == 10 ? 2 : 1;
    EXPECT_EQ(count, expected) << "rho " << rn.first << " N " << rn.second;
  }
}

TEST(ReferenceValues, SelectionPopulationIsValidTokensInFlatOrder) {
  // Two responses; the masked token has the largest entropy (NaN logp: never read). Valid
  // entropies: 0.8 0.3 | 0.8 0.8 0.1, N = 5, k = ceil(0.4 * 5) = 2 -> the first two 0.8s by
  // flat position: tokens 0 and 3.
  batch b = packed({{-1, -1, -1}, {-1, -1, -1}}, {{-1, -1, -1}, {-1, -1, -1}}, {2});
  b.mask = {1, 1, 0, 1, 1, 1};
  b.entropy = {0.8, 0.3, 9.0, 0.8, 0.8, 0.1};
  b.logp[2] = std::numeric_limits<double>::quiet_NaN();
  b.advantages = {1, 1};
  EXPECT_EQ(kept_for(b, selection::top_k, 0.4), (std::vector<std::uint8_t>{1, 0, 0, 1, 0, 0}));
  // A caller's cut: H > 0.8 plus the first `given_ties` tokens with H == 0.8 ...
  config c = bare(ratio::token);
  c.select = selection::top_k;
  c.use_given_cut = true;
  c.given_cut = 0.8;
  c.given_ties = 1;
  EXPECT_EQ(evaluate(b, c).kept, (std::vector<std::uint8_t>{1, 0, 0, 0, 0, 0}));
  c.given_ties = -1;  // ... or all of them
  EXPECT_EQ(evaluate(b, c).kept, (std::vector<std::uint8_t>{1, 0, 0, 1, 1, 0}));
  c.select = selection::quantile;
  c.given_cut = 0.3;
  EXPECT_EQ(evaluate(b, c).kept, (std::vector<std::uint8_t>{1, 1, 0, 1, 1, 0}));
}

TEST(ReferenceValues, SelectionDenominatorsAndKlStayOnAllTokens) {
  // One response of 5 tokens, entropies distinct; top_k rho 0.4 keeps 2 (H = 5, 4).
  batch b = entropy_batch({1, 5, 2, 4, 3});
  b.logp = {-1, -2, -3, -4, -5};
  b.old_logp = b.logp;
  b.ref_logp = {-1.1, -2, -3, -4, -5};  // d = 0.1 on token 0 (not kept)
  config c = bare(ratio::reinforce);
  c.select = selection::top_k;
  c.rho = 0.4;
  c.kl_mode = kl::k1;
  c.kl_beta = 0.5;
  output o = evaluate(b, c);  // denominator valid: c = 1/5
  expect_close(o.policy_loss, (2.0 + 4.0) / 5);
  expect_close(o.kl_loss, 0.5 * 0.1 / 5);
  expect_close(o.grad_logp[0], 0.5 / 5);          // KL only
  expect_close(o.grad_logp[1], -1.0 / 5 + 0.5 / 5);
  EXPECT_DOUBLE_EQ(o.kept_frac, 0.4);
  EXPECT_EQ(o.policy_tokens, 2);
  expect_close(o.entropy_kept_mean, 4.5);
  expect_close(o.entropy_mean, 3.0);
  c.denom = denominator::kept;  // policy c = 1/2, KL still 1/5
  o = evaluate(b, c);
  expect_close(o.policy_loss, (2.0 + 4.0) / 2);
  expect_close(o.kl_loss, 0.5 * 0.1 / 5);
  expect_close(o.grad_logp[1], -1.0 / 2 + 0.5 / 5);
  c.agg = aggregation::seq_mean_token_mean;
  c.norm_kept_responses = 4;  // kept counts: n = 2, R' replaced by 4
  o = evaluate(b, c);
  expect_close(o.policy_loss, (2.0 + 4.0) / 8);
  expect_close(o.kl_loss, 0.5 * 0.1 / 5);
}

// ---------------------------------------------------------------------------------------------
// Diagnostics.
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, TokenVarianceThirdsAndCounts) {
  // One response occupying [0, 7) with position 3 masked: valid positions 0 1 2 4 5 6, first 0,
  // last 6, span 7: thirds floor(3 (t - 0) / 7) = 0 0 0 1 2 2.
  const std::vector<double> lp = {-0.1, -0.5, -1.0, -9.0, -2.0, -0.3, -0.7};
  batch b = packed({lp}, {lp}, {1});
  b.mask = {1, 1, 1, 0, 1, 1, 1};
  b.rewards = {1};
  const output o = evaluate(b, preset("grpo"));
  auto v = [&](int t) { return std::exp(lp[t]) * (1 - std::exp(lp[t])); };
  expect_close(o.token_variance[0], (v(0) + v(1) + v(2)) / 3, 1e-13);
  expect_close(o.token_variance[1], v(4), 1e-13);
  expect_close(o.token_variance[2], (v(5) + v(6)) / 2, 1e-13);
  EXPECT_EQ(o.valid_tokens, 6);
  EXPECT_EQ(o.nonempty_responses, 1);
  EXPECT_EQ(o.zero_std_group_frac, 1.0);  // a singleton group
  EXPECT_EQ(o.advantages[0], 0.0);        // singleton -> 0
  EXPECT_EQ(o.ppo_kl, 0.0);
  EXPECT_EQ(o.ratio_mean, 1.0);
}

TEST(ReferenceValues, EmptyBatchGivesZeros) {
  batch b;
  b.group_offsets = {0};
  const output o = evaluate(b, preset("reco"));
  EXPECT_EQ(o.loss, 0.0);
  EXPECT_EQ(o.clip_frac, 0.0);
  EXPECT_EQ(o.ratio_min, 0.0);
  EXPECT_EQ(o.kept_frac, 0.0);
  EXPECT_EQ(o.weight_mean, 0.0);
  EXPECT_TRUE(o.grad_logp.empty());
  // Only empty responses: everything is 0 as well.
  batch e = packed({{}, {}}, {{}, {}}, {2});
  e.rewards = {1, 0};
  const output oe = evaluate(e, preset("rule_80_20_reco"));
  EXPECT_EQ(oe.loss, 0.0);
  EXPECT_EQ(oe.nonempty_responses, 0);
  EXPECT_EQ(oe.weights, (std::vector<double>{0, 0}));
}

// ---------------------------------------------------------------------------------------------
// On-policy identity: with old_logp = logp the variance, flipped, sequence and
// GMPO ratios all equal 1 and give the token ratio's loss and gradient.
// ---------------------------------------------------------------------------------------------

TEST(ReferenceValues, OnPolicyIdentity) {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    batch b = reco_ref_test::random_batch(seed + 500, reco_ref_test::shape_for_seed(seed));
    batch off = b;
    b.old_logp = b.logp;
    for (const char* name : {"grpo", "dapo", "rule_80_20", "reco_response_only"}) {
      const config token_cfg = preset(name);
      const output base = evaluate(b, token_cfg);
      for (ratio form : {ratio::variance, ratio::flipped, ratio::flipped_all, ratio::sequence, ratio::gmpo}) {
        config c = token_cfg;
        c.ratio_form = form;
        const output o = evaluate(b, c);
        EXPECT_NEAR(o.loss, base.loss, 1e-15) << name;
        for (std::size_t t = 0; t < o.grad_logp.size(); ++t) {
          EXPECT_NEAR(o.grad_logp[t], base.grad_logp[t], 1e-15) << name << " token " << t;
        }
        // Off-policy the forms differ: the identity above is not vacuous.
        // (Given advantages: a batch whose groups all have equal rewards has A = 0 throughout.)
        if (form == ratio::variance) {
          config cg = c, tg = token_cfg;
          cg.adv = advantage::given;
          tg.adv = advantage::given;
          EXPECT_GT(std::fabs(evaluate(off, cg).loss - evaluate(off, tg).loss), 1e-6) << name;
        }
      }
    }
    // And the reco preset equals reco_response_only on-policy (the weight is the same).
    const output reco = evaluate(b, preset("reco")), resp = evaluate(b, preset("reco_response_only"));
    EXPECT_NEAR(reco.loss, resp.loss, 1e-15);
  }
}

// ---------------------------------------------------------------------------------------------
// Presets and errors.
// ---------------------------------------------------------------------------------------------

TEST(ReferencePresets, TableOfComponents) {
  ASSERT_EQ(preset_names().size(), 21u);
  for (const std::string& n : preset_names()) EXPECT_NO_THROW(preset(n)) << n;
  EXPECT_THROW(preset("ppo"), std::invalid_argument);

  config c = preset("grpo");
  EXPECT_TRUE(c.adv == advantage::grpo && c.ratio_form == ratio::token && c.clip_mode == clip::ppo);
  EXPECT_TRUE(c.eps_low == 0.2 && c.eps_high == 0.2 && c.dual_mode == dual::hard && c.dual_c == 3);
  EXPECT_TRUE(c.weight_mode == weight::uniform && c.select == selection::all);
  EXPECT_TRUE(c.agg == aggregation::seq_mean_token_mean && c.kl_mode == kl::k3 && c.kl_beta == 0.001);
  c = preset("dr_grpo");
  EXPECT_TRUE(c.adv == advantage::dr_grpo && c.dual_mode == dual::off && c.kl_mode == kl::none);
  EXPECT_TRUE(c.agg == aggregation::seq_mean_token_sum_norm && c.eps_low == 0.2 && c.eps_high == 0.2);
  c = preset("dapo");
  EXPECT_TRUE(c.eps_low == 0.2 && c.eps_high == 0.28 && c.dual_mode == dual::hard && c.dual_c == 10);
  EXPECT_TRUE(c.agg == aggregation::token_mean && c.kl_mode == kl::none);
  c = preset("gspo");
  EXPECT_TRUE(c.ratio_form == ratio::sequence && c.eps_low == 3e-4 && c.eps_high == 4e-4);
  EXPECT_TRUE(c.dual_mode == dual::off && c.agg == aggregation::seq_mean_token_mean && c.kl_mode == kl::none);
  c = preset("cispo");
  EXPECT_TRUE(c.ratio_form == ratio::cispo && c.clip_mode == clip::none && c.agg == aggregation::token_mean);
  c = preset("aspo");
  EXPECT_TRUE(c.ratio_form == ratio::flipped && c.dual_mode == dual::soft && c.dual_c == 3);
  EXPECT_TRUE(c.agg == aggregation::token_mean && c.kl_mode == kl::k3);
  c = preset("reco");
  EXPECT_TRUE(c.ratio_form == ratio::variance && c.weight_mode == weight::expected_count && c.weight_cap == 10);
  EXPECT_TRUE(c.dual_mode == dual::hard && c.dual_c == 3 && c.kl_mode == kl::k3);
  EXPECT_TRUE(preset("reco_response_only").ratio_form == ratio::token);
  EXPECT_TRUE(preset("reco_response_only").weight_mode == weight::expected_count);
  EXPECT_TRUE(preset("reco_token_only").weight_mode == weight::uniform);
  EXPECT_TRUE(preset("reco_token_only").ratio_form == ratio::variance);
  EXPECT_EQ(preset("reco_no_cap").weight_cap, 0.0);
  c = preset("dapo_reco");
  EXPECT_TRUE(c.ratio_form == ratio::variance && c.weight_mode == weight::expected_count && c.eps_high == 0.28);
  c = preset("rule_80_20");
  EXPECT_TRUE(c.select == selection::top_k && c.rho == 0.2 && c.denom == denominator::valid && c.dual_c == 10);
  EXPECT_TRUE(c.ratio_form == ratio::token && c.weight_mode == weight::uniform);
  c = preset("rule_80_20_reco");
  EXPECT_TRUE(c.select == selection::top_k && c.ratio_form == ratio::variance && c.weight_mode == weight::expected_count);
  // TRL's loss types under TRL's defaults.
  for (const char* n : {"trl_bnpo", "trl_luspo", "trl_vespo"}) {
    c = preset(n);
    EXPECT_TRUE(c.adv == advantage::grpo && c.adv_eps == 1e-4 && c.log_ratio_clamp == 0) << n;
    EXPECT_TRUE(c.dual_mode == dual::off && c.delta == 0 && c.kl_mode == kl::none) << n;
  }
  c = preset("trl_bnpo");
  EXPECT_TRUE(c.ratio_form == ratio::token && c.clip_mode == clip::ppo && c.eps_low == 0.2 && c.eps_high == 0.2);
  EXPECT_TRUE(c.agg == aggregation::token_mean);
  c = preset("trl_luspo");
  EXPECT_TRUE(c.ratio_form == ratio::sequence && c.clip_mode == clip::ppo && c.agg == aggregation::seq_mean_token_sum_all);
  c = preset("trl_vespo");
  EXPECT_TRUE(c.ratio_form == ratio::vespo && c.clip_mode == clip::none && c.agg == aggregation::token_mean);
  EXPECT_TRUE(c.vespo_k_pos == 2 && c.vespo_lambda_pos == 3 && c.vespo_k_neg == 3 && c.vespo_lambda_neg == 2);
}

TEST(ReferencePresets, MissingInputsAndMisuseThrow) {
  batch b = one_token(-1, -1, 1);
  b.rewards = {1};
  b.ref_logp.clear();
  EXPECT_THROW(evaluate(b, preset("grpo")), std::invalid_argument);  // KL needs ref_logp
  b = one_token(-1, -1, 1);
  b.entropy.clear();
  EXPECT_THROW(evaluate(b, preset("rule_80_20")), std::invalid_argument);
  config c = bare(ratio::cispo);
  c.clip_mode = clip::ppo;
  EXPECT_THROW(evaluate(one_token(-1, -1, 1), c), std::invalid_argument);
  b = packed({{-1, -1}, {-1}}, {{-1, -1}, {-1}}, {2});
  b.token_end[0] = 3;  // overlaps response 1
  EXPECT_THROW(evaluate(b, bare(ratio::token)), std::invalid_argument);
  b = packed({{-1}}, {{-1}}, {1});
  b.group_offsets = {0, 2};
  EXPECT_THROW(evaluate(b, bare(ratio::token)), std::invalid_argument);
  b = packed({{-1}}, {{-1}}, {1});
  b.advantages.clear();
  EXPECT_THROW(evaluate(b, bare(ratio::token)), std::invalid_argument);
}

}  // namespace
