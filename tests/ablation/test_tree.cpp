// The strategy-tree study's exact evaluation, its chain rule through reco's objectives and its
// statistics, against independent naive computations: probabilities built node by node from
// their own softmax, Pass@k by enumerating k-tuples of responses, entropy by the chain rule,
// gradients by central finite differences of the objective's loss.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "claims.hpp"
#include "exact.hpp"
#include "paired_t.hpp"
#include "task.hpp"
#include "train.hpp"

namespace {

using namespace tree;

task_config small_task() {
  task_config c;
  c.strategies = 3;
  c.exec = 1;
  c.options = 2;
  c.common = 1;
  c.train_problems = 3;
  c.test_problems = 2;
  c.valid_common = 0.6;
  c.valid_rare = 0.5;
  return c;
}

// The base parameters plus noise, so that no test relies on the base's structure.
std::vector<double> perturbed(const instance& in, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> Z(0.0, scale);
  std::vector<double> th = in.base;
  for (auto& x : th) x += Z(rng);
  return th;
}

// pi(y) of one response computed from scratch: each node's softmax by its own normaliser.
double naive_prob(const instance& in, const std::vector<double>& th, int p, const response& r) {
  const auto& L = in.lay;
  const task_config& c = in.cfg;
  auto softmax_at = [](const std::vector<double>& z, int k) {
    double s = 0;
    for (double v : z) s += std::exp(v);
    return std::exp(z[k]) / s;
  };
  std::vector<double> z(c.strategies);
  for (int s = 0; s < c.strategies; ++s) z[s] = th[L.a(s)] + th[L.u(p, s)];
  double pr = softmax_at(z, r.s);
  for (int t = 0; t < c.exec; ++t) {
    std::vector<double> e(c.options);
    for (int v = 0; v < c.options; ++v)
      e[v] = th[L.w(p, r.s, t, v)] + (v == in.problems[p].path[r.s * c.exec + t] ? th[L.h(r.s)] : 0.0);
    pr *= softmax_at(e, r.x[t]);
  }
  pr *= softmax_at({th[L.e(r.s)] + th[L.q(p, r.s)], 0.0}, r.end);
  return pr;
}

TEST(TreeTask, EnumerationIsADistributionAndMatchesNaiveProducts) {
  task_config c;  // the study's shape: 8 strategies, 2 execution tokens of 4 options
  c.train_problems = 4;
  c.test_problems = 4;
  const instance in = make_instance(c, 7);
  const std::vector<double> th = perturbed(in, 0.7, 3);
  for (int p = 0; p < 8; ++p) {
    node_logp n;
    problem_logp(in, th, p, n);
    std::vector<double> lp;
    all_response_logp(in, n, lp);
    ASSERT_EQ(static_cast<int>(lp.size()), c.responses());
    double total = 0;
    for (int k = 0; k < c.responses(); ++k) {
      total += std::exp(lp[k]);
      const response r = response_of(c, k);
      EXPECT_EQ(response_index(c, r), k);
      EXPECT_NEAR(std::exp(lp[k]), naive_prob(in, th, p, r), 1e-14);
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
    // The correct answers are exactly the enumerated responses the verifier accepts.
    double correct = 0;
    for (int k = 0; k < c.responses(); ++k)
      if (is_correct(in, p, response_of(c, k))) correct += std::exp(lp[k]);
    double listed = 0;
    for (double l : correct_logp(in, n, p)) listed += std::exp(l);
    EXPECT_NEAR(listed, correct, 1e-14);
    EXPECT_GT(correct, 0.0);
  }
}

TEST(TreeTask, TokenValuesAddUpToTheResponseLogProbability) {
  task_config c;
  c.train_problems = 3;
  c.test_problems = 1;
  const instance in = make_instance(c, 11);
  const std::vector<double> th = perturbed(in, 0.5, 5);
  std::mt19937_64 rng(2);
  const rollouts b = sample(in, th, {0, 1, 2}, 8, rng);
  for (int i = 0; i < b.R; ++i) {
    double s = 0;
    for (int t = 0; t < b.L; ++t) s += b.old_logp[i * b.L + t];
    EXPECT_NEAR(std::exp(s), naive_prob(in, th, b.problem[i], b.resp[i]), 1e-13);
    EXPECT_EQ(b.reward[i], is_correct(in, b.problem[i], b.resp[i]) ? 1.0 : 0.0);
  }
}

TEST(TreeExact, PassAtKMatchesEnumeratingEveryKTuple) {
  const instance in = make_instance(small_task(), 3);
  const std::vector<double> th = perturbed(in, 0.8, 9);
  const task_config& c = in.cfg;
  const int n = c.responses();  // 3 * 2 * 2 = 12
  for (int p = 0; p < 5; ++p) {
    const problem_eval e = evaluate_problem(in, th, p);
    std::vector<double> prob(n);
    std::vector<bool> ok(n);
    for (int k = 0; k < n; ++k) prob[k] = naive_prob(in, th, p, response_of(c, k)), ok[k] = is_correct(in, p, response_of(c, k));
    for (int k = 1; k <= 3; ++k) {
      // P(at least one correct among k independent draws), summed over all n^k ordered tuples.
      double hit = 0;
      std::vector<int> idx(k, 0);
      for (;;) {
        double pr = 1;
        bool any = false;
        for (int j = 0; j < k; ++j) pr *= prob[idx[j]], any = any || ok[idx[j]];
        if (any) hit += pr;
        int j = 0;
        while (j < k && ++idx[j] == n) idx[j++] = 0;
        if (j == k) break;
      }
      EXPECT_NEAR(pass_at_k_exact(e.p_correct, k), hit, 1e-13) << "problem " << p << " k " << k;
    }
  }
  EXPECT_EQ(pass_at_k_exact(0.0, 64), 0.0);
  EXPECT_EQ(pass_at_k_exact(1.0, 64), 1.0);
  // 1 - (1 - p)^k cancels for small p; the exact value's relative error is what counts.
  EXPECT_NEAR(pass_at_k_exact(1e-6, 1000), 1 - std::pow(1 - 1e-6, 1000), 1e-10 * 1e-3);
}

TEST(TreeExact, EntropyKlAndFigureOneAgainstNaiveSums) {
  task_config c;
  c.train_problems = 2;
  c.test_problems = 2;
  const instance in = make_instance(c, 5);
  const std::vector<double> th = perturbed(in, 0.6, 1);
  for (int p = 0; p < 4; ++p) {
    const problem_eval e = evaluate_problem(in, th, p);
    double h = 0, kl = 0, pc = 0, fig = 0, fig_base = 0, pcb = 0, hq = 0;
    std::vector<double> pcorr;
    for (int k = 0; k < c.responses(); ++k) {
      const response r = response_of(c, k);
      const double q = naive_prob(in, th, p, r), qb = naive_prob(in, in.base, p, r);
      h -= q * std::log(q);
      kl += q * std::log(q / qb);
      if (is_correct(in, p, r)) {
        pc += q;
        pcb += qb;
        fig += q * std::log(qb) / c.length();
        fig_base += qb * std::log(qb) / c.length();
        pcorr.push_back(q);
      }
    }
    for (double q : pcorr) hq -= q / pc * std::log(q / pc);
    EXPECT_NEAR(e.seq_entropy, h, 1e-12);
    // Chain rule of entropy: the sequence entropy is the sum over positions of the expected node
    // entropy, i.e. L times the mean token entropy.
    EXPECT_NEAR(e.token_entropy * c.length(), h, 1e-12);
    EXPECT_NEAR(e.kl, kl, 1e-12);
    EXPECT_NEAR(e.p_correct, pc, 1e-14);
    EXPECT_NEAR(e.fig1_policy, fig / pc, 1e-12);
    EXPECT_NEAR(e.fig1_shift, fig / pc - fig_base / pcb, 1e-12);
    EXPECT_NEAR(e.effective_correct, std::exp(hq), 1e-12);
  }
}

// The objective's loss on a fixed batch as a function of the parameters (logp from th, old_logp,
// ref_logp and rewards fixed), for the finite differences.
double loss_at(const instance& in, const std::vector<double>& th, const rollouts& b, const objective_fn& f,
               const std::vector<double>& w) {
  std::vector<double> logp, ent;
  token_values(in, th, b.problem, b.resp, 0, b.R, logp, &ent);
  batch_type v = view(b, 0, b.R, logp, b.offsets, w);
  v.entropy = reco::span<const double>(ent.data(), ent.size());
  std::vector<double> g(logp.size());
  ws_type ws;
  return f(v, grads_type{g, {}}, ws).loss;
}

TEST(TreeTrain, ChainRuleMatchesFiniteDifferencesOfTheObjective) {
  task_config c;
  c.train_problems = 3;
  c.test_problems = 1;
  const instance in = make_instance(c, 21);
  const std::vector<double> old_th = perturbed(in, 0.4, 8);
  std::mt19937_64 rng(4);
  const rollouts b = sample(in, old_th, {0, 1, 2}, 8, rng);
  // The current policy a little off the sampling one (off-policy, ratios near 1, inside the clip).
  const std::vector<double> th = [&] {
    std::vector<double> t = old_th;
    std::mt19937_64 r2(13);
    std::normal_distribution<double> Z(0.0, 0.02);
    for (auto& x : t) x += Z(r2);
    return t;
  }();
  std::vector<double> w;
  for (int i = 0; i < b.R; ++i) {
    double lp = 0;
    for (int t = 0; t < b.L; ++t) lp += b.old_logp[i * b.L + t];
    w.push_back(std::exp(-0.5 * lp) / 8);
  }
  // Objectives whose loss is the function of logp they differentiate: the loss itself by finite
  // differences. ReCo's variance ratio is a surrogate (v = p (1 - sg p) / ..., gradient weight v),
  // so for every objective the chain rule is also checked on the linear functional
  // sum_t g_t logp_t(th) with g the objective's d loss / d logp.
  for (const std::string name : {"grpo", "response_only", "dapo", "weight_a05", "reco", "dapo_reco", "rule_80_20_reco"}) {
    const objective_fn f = make_objective(find_arm(name));
    const bool surrogate = find_arm(name).variance_ratio;
    std::vector<double> logp, ent;
    token_values(in, th, b.problem, b.resp, 0, b.R, logp, &ent);
    batch_type v = view(b, 0, b.R, logp, b.offsets, w);
    v.entropy = reco::span<const double>(ent.data(), ent.size());
    std::vector<double> g(logp.size()), grad;
    ws_type ws;
    f(v, grads_type{g, {}}, ws);
    chain_rule(in, th, b.problem, b.resp, 0, b.R, g, grad);
    auto linear = [&](const std::vector<double>& t) {
      std::vector<double> lp;
      token_values(in, t, b.problem, b.resp, 0, b.R, lp, nullptr);
      double s = 0;
      for (std::size_t j = 0; j < lp.size(); ++j) s += g[j] * lp[j];
      return s;
    };
    const layout& L = in.lay;
    const std::vector<int> probe = {L.a(0), L.a(3), L.h(0), L.h(2), L.e(1), L.u(0, 0), L.u(1, 4), L.w(2, 0, 1, 3),
                                    L.w(0, 1, 0, 0), L.q(1, 0), L.q(2, 5)};
    double largest = 0;
    for (int j : probe) {
      std::vector<double> tp = th, tm = th;
      const double h = 1e-6;
      tp[j] += h;
      tm[j] -= h;
      const double fd_lin = (linear(tp) - linear(tm)) / (2 * h);
      EXPECT_NEAR(grad[j], fd_lin, 1e-8 + 1e-6 * std::abs(fd_lin)) << name << " parameter " << j;
      if (!surrogate) {
        const double fd = (loss_at(in, tp, b, f, w) - loss_at(in, tm, b, f, w)) / (2 * h);
        EXPECT_NEAR(grad[j], fd, 1e-7 + 1e-5 * std::abs(fd)) << name << " parameter " << j;
      }
      largest = std::max(largest, std::abs(fd_lin));
    }
    EXPECT_GT(largest, 1e-4) << name << ": the probes must see a gradient";
  }
}

TEST(TreeTrain, DoseAtOneOverLIsReCosResponseWeight) {
  // w = min(10, pi_old^(-1/L) / G) given to caller_weight reproduces reco_response_only, whose
  // weight is 1 / (G pbar_old) with pbar = pi^(1/L) for responses of L tokens.
  task_config c;
  c.train_problems = 4;
  c.test_problems = 1;
  const instance in = make_instance(c, 2);
  std::mt19937_64 rng(6);
  const rollouts b = sample(in, in.base, {0, 1, 2, 3}, 8, rng);
  std::vector<double> w;
  for (int i = 0; i < b.R; ++i) {
    double lp = 0;
    for (int t = 0; t < b.L; ++t) lp += b.old_logp[i * b.L + t];
    w.push_back(std::exp(-lp / b.L) / 8);
  }
  const std::vector<double> th = perturbed(in, 0.01, 3);
  std::vector<double> logp, ent;
  token_values(in, th, b.problem, b.resp, 0, b.R, logp, &ent);
  batch_type v = view(b, 0, b.R, logp, b.offsets, w);
  std::vector<double> g1(logp.size()), g2(logp.size());
  ws_type ws;
  // weight_a05 is the caller_weight objective; its weights are the ones given (alpha = 1/L here).
  const auto a = make_objective(find_arm("weight_a05"))(v, grads_type{g1, {}}, ws);
  const auto r = make_objective(find_arm("response_only"))(v, grads_type{g2, {}}, ws);
  EXPECT_NEAR(a.loss, r.loss, 1e-12);
  for (std::size_t j = 0; j < g1.size(); ++j) EXPECT_NEAR(g1[j], g2[j], 1e-12);
  EXPECT_EQ(a.stats.weight_cap_hits, r.stats.weight_cap_hits);
}

TEST(TreeTrain, TrainingIsDeterministicAndMeasuresTheWeightExponent) {
  task_config c;
  c.train_problems = 8;
  c.test_problems = 8;
  const instance in = make_instance(c, 4);
  train_config t;
  t.steps = 4;
  t.prompts = 4;
  t.eval_every = 2;
  const run_result a = train(in, find_arm("response_only"), t, 9), b = train(in, find_arm("response_only"), t, 9);
  ASSERT_EQ(a.test.pass.size(), b.test.pass.size());
  for (std::size_t j = 0; j < a.test.pass.size(); ++j) EXPECT_EQ(a.test.pass[j], b.test.pass[j]);
  // The implied weight of ReCo's expected count falls as pi_old^(-1/L) below the cap.
  ASSERT_GT(a.wexp_reco_den, 0.0);
  EXPECT_NEAR(a.wexp_reco_num / a.wexp_reco_den, -1.0 / c.length(), 1e-6);
  EXPECT_NEAR(a.wexp_own_num / a.wexp_own_den, -1.0 / c.length(), 1e-6);
  ASSERT_EQ(a.trajectory.size(), 3u);  // steps 0, 2, 4
  EXPECT_EQ(a.trajectory.back().step, 4);
}

TEST(TreeStats, StudentTAgainstKnownQuantiles) {
  EXPECT_NEAR(t_quantile(0.975, 1), 12.7062, 1e-3);
  EXPECT_NEAR(t_quantile(0.975, 3), 3.18245, 1e-4);
  EXPECT_NEAR(t_quantile(0.975, 39), 2.02269, 1e-4);
  EXPECT_NEAR(t_quantile(0.8, 39), 0.85099, 1e-4);
  EXPECT_NEAR(t_quantile(0.995, 10), 3.16927, 1e-4);
  EXPECT_NEAR(t_cdf(0.0, 5), 0.5, 1e-14);
  EXPECT_NEAR(t_cdf(2.015048, 5), 0.95, 1e-5);
  EXPECT_NEAR(t_quantile(0.975, 1e6), 1.95996, 1e-4);
}

TEST(TreeStats, PairedTIntervalAndDetectableEffect) {
  const std::vector<double> d = {0.3, -0.1, 0.4, 0.2, 0.5, 0.1};
  const paired_result r = paired_t(d);
  double m = 0, ss = 0;
  for (double x : d) m += x;
  m /= 6;
  for (double x : d) ss += (x - m) * (x - m);
  const double se = std::sqrt(ss / 5 / 6);
  EXPECT_NEAR(r.mean, m, 1e-15);
  EXPECT_NEAR(r.se, se, 1e-15);
  EXPECT_NEAR(r.hi - r.mean, 2.570582 * se, 1e-5);
  EXPECT_NEAR(r.p, 2 * (1 - t_cdf(m / se, 5)), 1e-12);
  EXPECT_LT(r.p, 0.05);
  EXPECT_NEAR(detectable_multiplier(0.05, 0.8, 6), 2.570582 + 0.919544, 1e-4);
}

TEST(TreeStats, MatchedComparisonInterpolatesTheControlsTrajectory) {
  std::vector<run_result::point> tr = {{0, 0.2, 0, 0, 0.90, 0.0, 0, 0}, {10, 0.4, 0, 0, 0.86, 0.5, 0, 0},
                                       {20, 0.6, 0, 0, 0.80, 1.0, 0, 0}};
  EXPECT_NEAR(at_first_crossing(tr, 0.5, &run_result::point::pass1, &run_result::point::pass1024), 0.83, 1e-12);
  EXPECT_NEAR(at_first_crossing(tr, 0.25, &run_result::point::kl, &run_result::point::pass1024), 0.88, 1e-12);
  EXPECT_TRUE(std::isnan(at_first_crossing(tr, 0.7, &run_result::point::pass1, &run_result::point::pass1024)));
  // A claim's differences: treatment's final value against the control's at the crossing.
  run_result t, u;
  t.arm = "reco";
  u.arm = "grpo";
  t.trajectory = {{0, 0.2, 0, 0, 0.90, 0.0, 0, 0}, {20, 0.5, 0, 0, 0.88, 0.3, 0, 0}};
  u.trajectory = tr;
  std::map<std::string, std::map<uint64_t, const run_result*>> runs = {{"reco", {{1, &t}}}, {"grpo", {{1, &u}}}};
  tree_claim c{"X", "x", "reco", "grpo", "matched_pass1:pass1024"};
  int excluded = 0;
  const std::vector<double> d = claim_differences(c, runs, excluded);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NEAR(d[0], 0.88 - 0.83, 1e-12);
  EXPECT_EQ(excluded, 0);
  // Reversed: the treatment's trajectory where its Pass@1 reaches the control's final 0.6 (never:
  // excluded), and where its KL reaches the control's final 1.0 (never either); at 0.35 it would.
  tree_claim r{"Y", "y", "reco", "grpo", "rmatched_pass1:pass1024"};
  EXPECT_TRUE(claim_differences(r, runs, excluded).empty());
  EXPECT_EQ(excluded, 1);
  u.trajectory.back().pass1 = 0.35;
  const std::vector<double> e = claim_differences(r, runs, excluded);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NEAR(e[0], (0.90 + 0.5 * (0.88 - 0.90)) - 0.80, 1e-12);
}

}  // namespace
