// Inputs at the edges of the definitions, each a once-silent wrong answer: the loss and gradient
// through the public objective call on the CPU backend (packed and scalar token paths), against
// the independent reference (tests/reference) and, for the smallest cases, against the
// definition written out by hand in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/compare.hpp"
#include "reco/presets.hpp"
#include "reco/reco.hpp"
#include "reco/registry.hpp"

namespace {

using reco::index_t;
using reco_test::master_batch;

// A packed batch with one valid token per entry of `lengths`' responses (no mask), from explicit
// per-token values. ref_logp = logp (every KL term 0 with gradient 0), entropy 1.
master_batch explicit_batch(const std::vector<index_t>& lengths, const std::vector<index_t>& group_offsets,
                            const std::vector<double>& rewards, const std::vector<double>& logp,
                            const std::vector<double>& old_logp) {
  master_batch m;
  m.padded = false;
  m.R = static_cast<index_t>(lengths.size());
  m.lengths = lengths;
  m.offsets.push_back(0);
  for (index_t n : lengths) m.offsets.push_back(m.offsets.back() + n);
  m.N = m.offsets.back();
  m.group_offsets = group_offsets;
  m.rewards = rewards;
  m.logp = logp;
  m.old_logp = old_logp;
  m.ref_logp = logp;
  m.entropy.assign(logp.size(), 1.0);
  return m;
}

// Loss parts and gradients of both CPU token paths against the reference, in double.
template <class Obj>
void expect_reference(const Obj& obj, const reco_ref::config& cfg, const master_batch& m, const std::string& label,
                      const reco::normalisers& norm = {}) {
  const reco_ref::output ref = reco_ref::evaluate(reco_test::to_reference(m), cfg);
  ASSERT_TRUE(std::isfinite(ref.loss)) << label;
  for (bool vectorise : {true, false}) {
    SCOPED_TRACE(label + reco_test::path_name(vectorise));
    const reco_test::library_output lib = reco_test::run_library<double>(obj, m, norm, vectorise);
    const double scale = std::max({std::fabs(ref.policy_loss), std::fabs(ref.kl_loss), 1e-3});
    EXPECT_TRUE(reco_test::close(lib.result.loss, ref.loss, 1e-10, 1e-14 * scale, "loss"));
    EXPECT_TRUE(reco_test::close(lib.result.policy_loss, ref.policy_loss, 1e-10, 1e-14 * scale, "policy_loss"));
    EXPECT_TRUE(reco_test::close(lib.result.kl_loss, ref.kl_loss, 1e-10, 1e-14 * scale, "kl_loss"));
    double gmax = 0;
    for (double g : ref.grad_logp) gmax = std::max(gmax, std::fabs(g));
    ASSERT_EQ(lib.grad_logp.size(), ref.grad_logp.size());
    for (std::size_t t = 0; t < ref.grad_logp.size(); ++t)
      EXPECT_TRUE(reco_test::close(lib.grad_logp[t], ref.grad_logp[t], 1e-10, 1e-14 * gmax,
                                   "grad_logp[" + std::to_string(t) + "]"));
    EXPECT_TRUE(reco_test::close(lib.result.stats.dual_clip_frac, ref.dual_clip_frac, 1e-12, 0, "dual_clip_frac"));
  }
}

template <class Obj>
reco_test::library_output run(const Obj& obj, const master_batch& m, bool vectorise,
                               const reco::normalisers& norm = {}) {
  return reco_test::run_library<double>(obj, m, norm, vectorise);
}

// GRPO's advantage of a two-response group with rewards (1, 0): +-0.5 / (std + 1e-6).
double two_response_advantage() { return 0.5 / (std::sqrt(0.5) + 1e-6); }

// ---------------------------------------------------------------------------------------------
// 1. ASPO's soft dual clip where the +-20 log-ratio clamp bites.
// ---------------------------------------------------------------------------------------------

// A > 0 and log-ratio -20.5: the clamped ratio is e^-20, 1/rho = e^20 > c = 3, so the soft dual
// clip applies (loss -A c logp, gradient -A c) although the clamp has set omega to 0.
TEST(Findings, AspoSoftDualClipWhereTheClampBitesPositiveAdvantage) {
  const master_batch m = explicit_batch({1, 1}, {0, 2}, {1.0, 0.0}, {-21.5, -0.7}, {-1.0, -0.7});
  reco::presets::aspo obj;
  const double A = two_response_advantage(), c = 3.0;
  // token_mean over 2 tokens; token 1 (A < 0, ratio 1, unclipped): loss -(-A) 1, gradient A.
  const double want_loss = (-A * c * -21.5 + A * 1.0) / 2;
  const double want_grad[2] = {-A * c / 2, A * 1.0 / 2};
  for (bool vectorise : {true, false}) {
    const auto lib = run(obj, m, vectorise);
    EXPECT_NEAR(lib.result.loss, want_loss, 1e-12 * std::fabs(want_loss)) << reco_test::path_name(vectorise);
    EXPECT_NEAR(lib.grad_logp[0], want_grad[0], 1e-12) << reco_test::path_name(vectorise);
    EXPECT_NEAR(lib.grad_logp[1], want_grad[1], 1e-12) << reco_test::path_name(vectorise);
    EXPECT_EQ(lib.result.stats.dual_clip_frac, 0.5);
  }
  expect_reference(obj, reco_ref::preset("aspo"), m, "aspo, A > 0");
}

// The mirror: A < 0 and log-ratio +20.5: rho = e^20 > c.
TEST(Findings, AspoSoftDualClipWhereTheClampBitesNegativeAdvantage) {
  const master_batch m = explicit_batch({1, 1}, {0, 2}, {0.0, 1.0}, {-1.0, -0.7}, {-21.5, -0.7});
  reco::presets::aspo obj;
  const double A = two_response_advantage(), c = 3.0;
  // Token 0: A0 = -A, loss -A0 c logp = A c (-1); token 1: A1 = A > 0, flipped, ratio 1: loss -A.
  const double want_loss = (A * c * -1.0 - A) / 2;
  const double want_grad[2] = {A * c / 2, -A / 2};
  for (bool vectorise : {true, false}) {
    const auto lib = run(obj, m, vectorise);
    EXPECT_NEAR(lib.result.loss, want_loss, 1e-12 * std::fabs(want_loss)) << reco_test::path_name(vectorise);
    EXPECT_NEAR(lib.grad_logp[0], want_grad[0], 1e-12) << reco_test::path_name(vectorise);
    EXPECT_NEAR(lib.grad_logp[1], want_grad[1], 1e-12) << reco_test::path_name(vectorise);
  }
  expect_reference(obj, reco_ref::preset("aspo"), m, "aspo, A < 0");

  // flip_all (the reciprocal surrogate for A < 0 too): 1/rho = e^-20 is not above c, and the
  // clip is the usual one on rho, so the reference and the library agree there as well.
  reco::presets::aspo all;
  all.ratio.params.flip_all = true;
  reco_ref::config cfg = reco_ref::preset("aspo");
  cfg.ratio_form = reco_ref::ratio::flipped_all;
  expect_reference(all, cfg, m, "aspo, flip_all");
}

// ---------------------------------------------------------------------------------------------
// 2. eps = 0 and an all-equal group: A = 0 (0 / 0 defined as 0), not NaN.
// ---------------------------------------------------------------------------------------------

TEST(Findings, ZeroEpsAllEqualGroupGivesZeroAdvantage) {
  // Group 0: three rewards 0.1 (their rounded float sum / 3 is not 0.1); group 1: (0.5, 0.5);
  // group 2: (1, 0).
  const master_batch m = explicit_batch({2, 1, 1, 2, 1, 1, 2}, {0, 3, 5, 7}, {0.1, 0.1, 0.1, 0.5, 0.5, 1.0, 0.0},
                                        {-0.5, -1.0, -0.3, -2.0, -0.1, -0.2, -0.4, -0.6, -0.9, -1.1},
                                        {-0.6, -0.9, -0.3, -1.5, -0.2, -0.2, -0.5, -0.5, -1.0, -1.0});
  reco::presets::dapo obj;
  obj.advantage.params.eps = 0;
  reco_ref::config cfg = reco_ref::preset("dapo");
  cfg.adv_eps = 0;
  for (bool vectorise : {true, false}) {
    const auto lib = run(obj, m, vectorise);
    ASSERT_TRUE(std::isfinite(lib.result.loss)) << reco_test::path_name(vectorise);
    for (std::size_t t = 0; t < 7; ++t) EXPECT_EQ(lib.grad_logp[t], 0.0) << "token " << t;  // groups 0 and 1
    EXPECT_EQ(lib.result.stats.zero_std_group_frac, 2.0 / 3.0);
  }
  expect_reference(obj, cfg, m, "dapo, eps 0");

  // The same with pass@k (std-scaled gap) and the batch-std estimator over an all-equal batch.
  reco::objective<reco::pass_at_k_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean>
      pk;
  pk.advantage.params.eps = 0;
  reco_ref::config pk_cfg = cfg;
  pk_cfg.adv = reco_ref::advantage::pass_at_k;
  pk_cfg.dual_mode = reco_ref::dual::off;
  expect_reference(pk, pk_cfg, m, "pass@k, eps 0");

  master_batch flat = m;
  for (double& s : flat.rewards) s = 0.25;
  reco::objective<reco::batch_std_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean>
      bs;
  bs.advantage.params.eps = 0;
  reco_ref::config bs_cfg = pk_cfg;
  bs_cfg.adv = reco_ref::advantage::batch_std;
  expect_reference(bs, bs_cfg, flat, "batch_std, eps 0");
  EXPECT_EQ(run(bs, flat, true).result.loss, 0.0);

  // REINFORCE++ whitening with eps = 0 over a batch whose group-stage values are all 0.
  reco::objective<reco::reinforce_pp_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::token_mean>
      rpp;
  rpp.advantage.params.eps = 0;
  reco_ref::config rpp_cfg = pk_cfg;
  rpp_cfg.adv = reco_ref::advantage::reinforce_pp;
  rpp_cfg.whiten_eps = 0;
  expect_reference(rpp, rpp_cfg, flat, "reinforce_pp, eps 0");
  EXPECT_EQ(run(rpp, flat, false).result.loss, 0.0);
}

// ---------------------------------------------------------------------------------------------
// 3. Global normalisers below the local counts are the caller's error.
// ---------------------------------------------------------------------------------------------

template <class Obj>
void expect_normaliser_error(const Obj& obj, const master_batch& m, const reco::normalisers& n,
                             const std::string& field) {
  for (bool vectorise : {true, false}) {
    try {
      run(obj, m, vectorise, n);
      ADD_FAILURE() << field << ": no error";
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), field);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

TEST(Findings, GlobalNormalisersBelowLocalCountsAreRejected) {
  reco_test::batch_spec spec;
  spec.masked_row = 0;
  const master_batch m = reco_test::make_batch(31, spec);
  reco::presets::grpo grpo;
  const auto local = run(grpo, m, true).result.stats;
  ASSERT_GT(local.valid_tokens, 2);

  reco::normalisers n;
  n.tokens = local.valid_tokens - 1;
  expect_normaliser_error(reco::presets::dapo{}, m, n, "normalisers.tokens");
  n = {};
  n.responses = local.nonempty_responses - 1;
  expect_normaliser_error(grpo, m, n, "normalisers.responses");

  // The kept counts matter (and are checked) only with the kept denominator.
  reco::presets::rule_80_20 rule;
  rule.select.params.denominator = reco::selection_denominator::kept;
  const auto kept = run(rule, m, true).result.stats;
  ASSERT_GT(kept.policy_tokens, 1);
  n = {};
  n.kept_tokens = kept.policy_tokens - 1;
  expect_normaliser_error(rule, m, n, "normalisers.kept_tokens");
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean, reco::top_entropy_selection>
      seq;
  seq.select.params.denominator = reco::selection_denominator::kept;
  n = {};
  n.kept_responses = 1;
  expect_normaliser_error(seq, m, n, "normalisers.kept_responses");
  reco::presets::rule_80_20 valid_rule;  // valid denominator: the kept normalisers are unused
  EXPECT_NO_THROW(run(valid_rule, m, true, n));

  // Equal or larger global counts are accepted, and scale as the definition says.
  n = {};
  n.tokens = local.valid_tokens;
  reco::presets::dapo dapo;
  const double base = run(dapo, m, true).result.loss;
  EXPECT_DOUBLE_EQ(run(dapo, m, true, n).result.loss, base);
  n.tokens = 2 * local.valid_tokens;
  EXPECT_NEAR(run(dapo, m, false, n).result.loss, base / 2, 1e-12 * std::fabs(base));
  reco_ref::config cfg = reco_ref::preset("dapo");
  cfg.norm_tokens = n.tokens;
  expect_reference(dapo, cfg, m, "dapo, global tokens", n);
}

// ---------------------------------------------------------------------------------------------
// 4. Rewards near the double range.
// ---------------------------------------------------------------------------------------------

TEST(Findings, HugeRewardsKeepTheirGroupStatistics) {
  for (std::uint64_t seed : {41u, 42u, 43u}) {
    reco_test::batch_spec spec;
    spec.binary_rewards = seed != 41;
    master_batch m = reco_test::make_batch(seed, spec);
    for (double& s : m.rewards) s *= 1e200;
    m.rewards[0] = 1.7e308;  // a singleton group (make_batch's first group)
    const std::string label = "seed " + std::to_string(seed);
    expect_reference(reco::presets::reco{}, reco_ref::preset("reco"), m, "reco, " + label);
    expect_reference(reco::presets::grpo{}, reco_ref::preset("grpo"), m, "grpo, " + label);
    expect_reference(reco::presets::dr_grpo{}, reco_ref::preset("dr_grpo"), m, "dr_grpo, " + label);
  }
  // The smallest case by hand: rewards (1e200, 0) give A = +-1/sqrt(2) (eps negligible).
  const master_batch m = explicit_batch({1, 1}, {0, 2}, {1e200, 0.0}, {-0.5, -0.5}, {-0.5, -0.5});
  reco::presets::dapo dapo;
  const double A = 0.5 / std::sqrt(0.5);
  for (bool vectorise : {true, false}) {
    const auto lib = run(dapo, m, vectorise);
    EXPECT_NEAR(lib.grad_logp[0], -A / 2, 1e-12);
    EXPECT_NEAR(lib.grad_logp[1], A / 2, 1e-12);
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Expected-count weights beyond the double range (old_logp = -800).
// ---------------------------------------------------------------------------------------------

using weighted = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::expected_count_weight,
                                 reco::seq_mean_token_mean>;

reco_ref::config weighted_config(double cap, reco_ref::weight_norm norm) {
  reco_ref::config c;
  c.adv = reco_ref::advantage::grpo;
  c.ratio_form = reco_ref::ratio::token;
  c.clip_mode = reco_ref::clip::ppo;
  c.weight_mode = reco_ref::weight::expected_count;
  c.weight_cap = cap;
  c.weight_normalisation = norm;
  c.agg = reco_ref::aggregation::seq_mean_token_mean;
  return c;
}

TEST(Findings, ExpectedCountWeightsBeyondTheDoubleRange) {
  reco_test::batch_spec spec;
  spec.masked_row = 0;
  master_batch m = reco_test::make_batch(51, spec);
  // Response 3 (in a group of at least 4 with mixed rewards, see below) sampled at -800 per
  // token: its weight is e^800 / G.
  index_t target = -1;
  for (std::size_t g = 0; g + 1 < m.group_offsets.size() && target < 0; ++g) {
    const index_t lo = m.group_offsets[g], hi = m.group_offsets[g + 1];
    if (hi - lo >= 4 && m.lengths[static_cast<std::size_t>(lo + 3)] > 0) target = lo + 3;
  }
  ASSERT_GE(target, 0);
  for (index_t t = m.begin(target); t < m.end(target); ++t) m.old_logp[static_cast<std::size_t>(t)] = -800.0;

  for (auto norm : {reco::weight_normalisation::group_mean, reco::weight_normalisation::batch_mean}) {
    for (double cap : {0.0, 10.0}) {
      weighted obj;
      obj.weight.params.cap = cap;
      obj.weight.params.normalise = norm;
      const auto ref_norm = norm == reco::weight_normalisation::group_mean ? reco_ref::weight_norm::group_mean
                                                                           : reco_ref::weight_norm::batch_mean;
      const std::string label = std::string(norm == reco::weight_normalisation::group_mean ? "group" : "batch") +
                                " mean, cap " + std::to_string(cap);
      expect_reference(obj, weighted_config(cap, ref_norm), m, label);
      const auto lib = run(obj, m, true);
      EXPECT_TRUE(std::isfinite(lib.result.stats.weight_max)) << label;
      EXPECT_TRUE(std::isfinite(lib.result.loss)) << label;
    }
  }
  // Uncapped and unnormalised, the weight itself is beyond the double range: an error naming
  // the input, not NaN.
  weighted raw;
  raw.weight.params.cap = 0;
  for (bool vectorise : {true, false}) {
    try {
      run(raw, m, vectorise);
      ADD_FAILURE() << "no error";
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), "batch.old_logp");
    }
  }
  EXPECT_THROW(run(reco::presets::reco_no_cap{}, m, true), reco::error);
  // With the cap (the paper's setting) the weight is simply capped.
  expect_reference(reco::presets::reco{}, reco_ref::preset("reco"), m, "reco, capped");
}

// ---------------------------------------------------------------------------------------------
// 6. No log-ratio clamp: an overflowing ratio times A = 0 contributes exactly 0.
// ---------------------------------------------------------------------------------------------

template <class Obj>
void expect_zero_advantage_contributes_nothing(Obj obj, reco_ref::config cfg, const std::string& name) {
  // Group 0: equal rewards (A = 0) and a token with logp - old_logp = 800 (ratio e^800 = inf);
  // group 1: rewards (1, 0), ordinary ratios.
  const master_batch m = explicit_batch({2, 1, 1, 2}, {0, 2, 4}, {1.0, 1.0, 1.0, 0.0},
                                        {-0.1, -0.5, -0.2, -0.3, -0.7, -0.4},
                                        {-800.1, -0.6, -0.25, -0.2, -0.8, -0.45});
  for (bool vectorise : {true, false}) {
    const auto lib = run(obj, m, vectorise);
    SCOPED_TRACE(name + reco_test::path_name(vectorise));
    ASSERT_TRUE(std::isfinite(lib.result.loss));
    for (std::size_t t = 0; t < 3; ++t) EXPECT_EQ(lib.grad_logp[t], 0.0) << "token " << t;
  }
  expect_reference(obj, cfg, m, name);
}

TEST(Findings, UnclampedOverflowingRatioWithZeroAdvantage) {
  {
    reco::presets::grpo o;
    o.ratio.params.log_ratio_clamp = 0;
    auto c = reco_ref::preset("grpo");
    c.log_ratio_clamp = 0;
    expect_zero_advantage_contributes_nothing(o, c, "grpo");
  }
  {
    reco::presets::dapo o;
    o.ratio.params.log_ratio_clamp = 0;
    auto c = reco_ref::preset("dapo");
    c.log_ratio_clamp = 0;
    expect_zero_advantage_contributes_nothing(o, c, "dapo");
  }
  {
    reco::presets::dr_grpo o;
    o.ratio.params.log_ratio_clamp = 0;
    auto c = reco_ref::preset("dr_grpo");
    c.log_ratio_clamp = 0;
    expect_zero_advantage_contributes_nothing(o, c, "dr_grpo");
  }
  {
    reco::presets::aspo o;
    o.ratio.params.log_ratio_clamp = 0;
    auto c = reco_ref::preset("aspo");
    c.log_ratio_clamp = 0;
    expect_zero_advantage_contributes_nothing(o, c, "aspo");
  }
  {
    reco::presets::gspo o;
    o.ratio.params.max_log_ratio = 1000;
    auto c = reco_ref::preset("gspo");
    c.seq_max_log = 1000;
    expect_zero_advantage_contributes_nothing(o, c, "gspo");
  }
  {
    reco::objective<reco::grpo_advantage, reco::sapo_ratio, reco::no_clip, reco::uniform_weight, reco::token_mean> o;
    o.ratio.params.log_ratio_clamp = 0;
    reco_ref::config c;
    c.ratio_form = reco_ref::ratio::sapo;
    c.clip_mode = reco_ref::clip::none;
    c.agg = reco_ref::aggregation::token_mean;
    c.log_ratio_clamp = 0;
    expect_zero_advantage_contributes_nothing(o, c, "sapo");
  }
}

// ---------------------------------------------------------------------------------------------
// ReCo's expected-count weight read from the rollout policy (weight.sampling = rollout): the
// weight is min(cap, 1 / (G exp(mean rollout_logp))) per response, and the loss is the same
// objective with those weights given as caller weights (old_logp only in the ratio and KL).
// ---------------------------------------------------------------------------------------------

TEST(Findings, ExpectedCountWeightReadsTheRolloutPolicy) {
  reco_test::batch_spec spec;
  spec.max_group = 6;
  for (const bool padded : {false, true}) {
    spec.padded = padded;
    const master_batch m = reco_test::make_batch(padded ? 41 : 43, spec);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> g(0.0, 0.4);
    // Every third response far less likely under the rollout policy: its weight reaches the cap.
    std::vector<double> rollout(m.logp.size());
    for (index_t i = 0; i < m.R; ++i)
      for (index_t t = m.begin(i); t < m.end(i); ++t)
        rollout[t] = std::min(-1e-4, m.old_logp[t] + g(rng) - (i % 3 == 0 ? 4.0 : 0.0));
    // The definition, by hand: G the group's size, the mean over the response's valid tokens.
    std::vector<double> w(static_cast<std::size_t>(m.R), 0.0);
    int capped = 0;
    for (std::size_t q = 0; q + 1 < m.group_offsets.size(); ++q) {
      const index_t G = m.group_offsets[q + 1] - m.group_offsets[q];
      for (index_t i = m.group_offsets[q]; i < m.group_offsets[q + 1]; ++i) {
        double sum = 0, n = 0;
        for (index_t t = m.begin(i); t < m.end(i); ++t)
          if (m.mask.empty() || m.mask[t]) sum += rollout[t], n += 1;
        if (n == 0) continue;
        const double raw = 1.0 / (static_cast<double>(G) * std::exp(sum / n));
        w[i] = std::min(10.0, raw);
        capped += raw > 10.0;
      }
    }
    reco::presets::reco on;
    on.weight.params.sampling = reco::weight_sampling::rollout;
    reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::caller_weight,
                    reco::seq_mean_token_mean, reco::kl_penalty>
        given;
    given.advantage = on.advantage;
    given.ratio = on.ratio;
    given.clip = on.clip;
    given.aggregate = on.aggregate;
    given.kl = on.kl;
    given.weight.params.cap = 0;
    reco_test::typed_batch<double> tb(m);
    for (const bool vectorise : {true, false}) {
      SCOPED_TRACE(std::string(padded ? "padded" : "packed") + reco_test::path_name(vectorise));
      std::vector<double> g_on(m.logp.size()), g_given(m.logp.size()), g_off(m.logp.size());
      reco::workspace<reco::cpu> ws;
      auto v_on = tb.view();
      v_on.rollout_logp = rollout;
      const auto r_on = on(reco_test::cpu_backend(vectorise), v_on, reco::gradients<double>{g_on, {}}, ws);
      auto v_given = tb.view();
      v_given.response_weights = w;
      const auto r_given =
          given(reco_test::cpu_backend(vectorise), v_given, reco::gradients<double>{g_given, {}}, ws);
      EXPECT_TRUE(reco_test::close(r_on.loss, r_given.loss, 1e-12, 1e-15, "loss"));
      double gmax = 0;
      for (double x : g_given) gmax = std::max(gmax, std::fabs(x));
      ASSERT_GT(gmax, 0);
      for (std::size_t t = 0; t < g_on.size(); ++t)
        EXPECT_TRUE(reco_test::close(g_on[t], g_given[t], 1e-12, 1e-14 * gmax, "grad_logp[" + std::to_string(t) + "]"));
      // The switch changes the loss: the default weight reads old_logp.
      const auto r_off = reco::presets::reco{}(reco_test::cpu_backend(vectorise), tb.view(),
                                               reco::gradients<double>{g_off, {}}, ws);
      EXPECT_GT(std::fabs(r_off.loss - r_on.loss), 1e-6 * std::fabs(r_on.loss));
    }
    EXPECT_GT(capped, 0);  // the cap bites on some responses
  }
}

TEST(Findings, RolloutSwitchErrorsNameTheArgument) {
  const master_batch m = reco_test::make_batch(5, reco_test::batch_spec{});
  reco_test::typed_batch<double> tb(m);
  std::vector<double> rollout(m.old_logp.begin(), m.old_logp.end());
  auto argument = [&](const auto& obj, std::vector<double> roll, bool give) {
    std::vector<double> grad(m.logp.size());
    reco::workspace<reco::cpu> ws;
    auto v = tb.view();
    if (give) v.rollout_logp = roll;
    try {
      obj(reco::cpu{}, v, reco::gradients<double>{grad, {}}, ws);
    } catch (const reco::error& e) {
      EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos);
      return e.argument();
    }
    return std::string();
  };
  reco::presets::reco on;
  on.weight.params.sampling = reco::weight_sampling::rollout;
  EXPECT_EQ(argument(on, rollout, true), "");
  EXPECT_EQ(argument(on, rollout, false), "batch.rollout_logp");               // switch on, none given
  EXPECT_EQ(argument(reco::presets::reco{}, rollout, true), "batch.rollout_logp");  // given, switch off
  EXPECT_EQ(argument(reco::presets::grpo{}, rollout, true), "batch.rollout_logp");  // a weight without it
  EXPECT_EQ(argument(on, std::vector<double>(rollout.begin(), rollout.end() - 1), true), "batch.rollout_logp");
  std::size_t valid = 0;
  while (!m.mask.empty() && !m.mask[valid]) ++valid;
  for (const double bad : {std::nan(""), 0.5, -HUGE_VAL}) {
    auto r = rollout;
    r[valid] = bad;
    EXPECT_EQ(argument(on, r, true), "batch.rollout_logp") << bad;
  }
  for (std::size_t t = 0; t < m.mask.size(); ++t)
    if (!m.mask[t]) {  // a masked token is not read
      auto r = rollout;
      r[t] = std::nan("");
      EXPECT_EQ(argument(on, r, true), "");
      break;
    }
  auto bad_switch = on;
  bad_switch.weight.params.sampling = static_cast<reco::weight_sampling>(2);
  EXPECT_EQ(argument(bad_switch, rollout, true), "weight.params.sampling");
  // An uncapped weight beyond the double range names the log-probs it averaged.
  reco::presets::reco_no_cap raw;
  raw.weight.params.sampling = reco::weight_sampling::rollout;
  auto far = rollout;
  index_t owner = 0;  // the response of the valid token found above
  while (m.end(owner) <= static_cast<index_t>(valid)) ++owner;
  for (index_t t = m.begin(owner); t < m.end(owner); ++t) far[static_cast<std::size_t>(t)] = -800.0;
  EXPECT_EQ(argument(raw, far, true), "batch.rollout_logp");
  EXPECT_EQ(argument(raw, rollout, true), "");
  // The switch by key, as the adapters set it.
  reco::presets::reco keyed;
  reco::registry::apply_overrides(keyed, reco::registry::override_list{{"weight.sampling", 1}});
  EXPECT_EQ(keyed.weight.params.sampling, reco::weight_sampling::rollout);
}

}  // namespace
