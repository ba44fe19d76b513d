// The ablation study's pre-registered statistics (examples/ablation/statistics.hpp): Holm's adjustment
// against hand-computed values, the bootstrap's point estimate against a direct computation, its
// interval on cases whose answer is known, and the verdict rule; the study's CSV files round-trip
// cells with commas and quotes (examples/ablation/io.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../../examples/ablation/io.hpp"

#include "../../examples/ablation/statistics.hpp"

namespace {

using ablation::claim;
using ablation::claim_result;
using ablation::hierarchical_bootstrap;
using ablation::stat_run;

TEST(AblationStats, HolmMatchesHandComputedValues) {
  // Sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> monotone 0.06).
  const auto adj = ablation::holm({0.03, 0.01, 0.04, 0.02});
  ASSERT_EQ(adj.size(), 4u);
  EXPECT_DOUBLE_EQ(adj[1], 0.04);
  EXPECT_DOUBLE_EQ(adj[3], 0.06);
  EXPECT_DOUBLE_EQ(adj[0], 0.06);
  EXPECT_DOUBLE_EQ(adj[2], 0.06);
  EXPECT_DOUBLE_EQ(ablation::holm({0.5, 0.6})[1], 1.0);  // capped at 1
}

std::vector<stat_run> runs_with(const std::string& config, int bases, int seeds, int problems, double level,
                                std::mt19937_64& rng, double noise) {
  std::vector<stat_run> out;
  std::normal_distribution<double> n(0.0, noise);
  for (int b = 1; b <= bases; ++b)
    for (int s = 0; s < seeds; ++s) {
      stat_run r;
      r.config = config;
      r.base = b;
      for (int p = 0; p < problems; ++p) r.pass.push_back(level + 0.01 * b + n(rng));
      out.push_back(r);
    }
  return out;
}

TEST(AblationStats, PointEstimateIsThePairedMeanDifference) {
  std::mt19937_64 rng(7);
  auto runs = runs_with("t", 3, 2, 10, 0.5, rng, 0.1);
  auto ctrl = runs_with("c", 3, 3, 10, 0.4, rng, 0.1);
  runs.insert(runs.end(), ctrl.begin(), ctrl.end());
  // Direct: per base, mean over its runs of the mean over problems; then mean of the differences.
  double expected = 0;
  for (int b = 1; b <= 3; ++b) {
    double st = 0, sc = 0;
    int nt = 0, nc = 0;
    for (const auto& r : runs) {
      if (r.base != b) continue;
      double m = 0;
      for (double v : r.pass) m += v;
      m /= static_cast<double>(r.pass.size());
      if (r.config == "t") st += m, ++nt;
      else sc += m, ++nc;
    }
    expected += st / nt - sc / nc;
  }
  expected /= 3;
  std::vector<int> idx(10), strata(10, 0);
  for (int i = 0; i < 10; ++i) idx[static_cast<std::size_t>(i)] = i;
  hierarchical_bootstrap boot(runs, idx, strata, 500, 1);
  const claim_result r = boot.evaluate({"x", "", "t", "c", "all", 1, claim::kind::greater, false});
  EXPECT_NEAR(r.delta, expected, 1e-12);
  EXPECT_EQ(r.bases, 3);
  EXPECT_EQ(r.runs_treatment, 6);
  EXPECT_EQ(r.runs_control, 9);
  EXPECT_LE(r.lo, r.delta);
  EXPECT_GE(r.hi, r.delta);
}

TEST(AblationStats, IdenticalSidesGiveAZeroIntervalAndAConstantShiftIsExact) {
  std::mt19937_64 rng(3);
  auto t = runs_with("t", 2, 2, 8, 0.3, rng, 0.05);
  std::vector<stat_run> runs = t;
  for (auto r : t) {  // the control: the same runs, shifted down by 0.1 on every problem
    r.config = "c";
    for (double& v : r.pass) v -= 0.1;
    runs.push_back(r);
  }
  std::vector<int> idx(8), strata(8);
  for (int i = 0; i < 8; ++i) idx[static_cast<std::size_t>(i)] = i, strata[static_cast<std::size_t>(i)] = i % 2;
  // Seeds are resampled independently on each side, so only a shift that is the same on every run
  // and problem has a degenerate interval: check it with one run per base and side.
  std::vector<stat_run> one;
  for (const auto& r : runs)
    if (std::find_if(one.begin(), one.end(), [&](const stat_run& o) { return o.config == r.config && o.base == r.base; }) ==
        one.end())
      one.push_back(r);
  hierarchical_bootstrap boot(one, idx, strata, 400, 2);
  const claim_result r = boot.evaluate({"x", "", "t", "c", "all", 1, claim::kind::greater, false});
  EXPECT_NEAR(r.delta, 0.1, 1e-12);
  EXPECT_NEAR(r.lo, 0.1, 1e-12);
  EXPECT_NEAR(r.hi, 0.1, 1e-12);
  EXPECT_NEAR(r.p, 1.0 / 400, 1e-15);  // every replicate > 0: the bootstrap's resolution
  const claim_result z = hierarchical_bootstrap(one, idx, strata, 400, 2)
                             .evaluate({"x", "", "t", "t", "all", 1, claim::kind::greater, false});
  EXPECT_EQ(z.delta, 0.0);
  EXPECT_EQ(z.lo, 0.0);
  EXPECT_EQ(z.hi, 0.0);
  EXPECT_EQ(z.p, 1.0);
}

TEST(AblationStats, NoiseWidensTheIntervalAndCoversTheTruth) {
  // 40 independent studies with a true Δ of 0.02: the 95 % interval should cover it in most.
  int covered = 0;
  for (int study = 0; study < 40; ++study) {
    std::mt19937_64 rng(100 + static_cast<uint64_t>(study));
    auto runs = runs_with("t", 4, 3, 24, 0.52, rng, 0.15);
    auto ctrl = runs_with("c", 4, 3, 24, 0.50, rng, 0.15);
    runs.insert(runs.end(), ctrl.begin(), ctrl.end());
    std::vector<int> idx(24), strata(24, 0);
    for (int i = 0; i < 24; ++i) idx[static_cast<std::size_t>(i)] = i;
    const claim_result r = hierarchical_bootstrap(runs, idx, strata, 300, 5)
                               .evaluate({"x", "", "t", "c", "all", 1, claim::kind::greater, false});
    EXPECT_GT(r.hi - r.lo, 0.0);
    covered += (r.lo <= 0.02 && 0.02 <= r.hi) ? 1 : 0;
  }
  EXPECT_GE(covered, 32);  // nominal 38 of 40; the bootstrap is somewhat narrow at 4 bases
}

TEST(AblationStats, VerdictRule) {
  claim_result r;
  r.c.direction = claim::kind::greater;
  r.delta = 0.03;
  r.p_adjusted = 0.01;
  EXPECT_EQ(ablation::verdict_of(r), "shown");
  r.delta = -0.03;
  EXPECT_EQ(ablation::verdict_of(r), "contradicted");
  r.p_adjusted = 0.2;
  EXPECT_EQ(ablation::verdict_of(r), "not shown");
  r.c.direction = claim::kind::less;
  r.p_adjusted = 0.01;
  EXPECT_EQ(ablation::verdict_of(r), "shown");
  r.c.direction = claim::kind::not_worse;
  r.c.margin = 0.02;
  r.lo = -0.015;
  r.hi = 0.01;
  EXPECT_EQ(ablation::verdict_of(r), "shown");
  r.lo = -0.03;
  EXPECT_EQ(ablation::verdict_of(r), "not shown");
  r.hi = -0.025;
  EXPECT_EQ(ablation::verdict_of(r), "contradicted");
}

TEST(AblationStats, MissingConfigurationIsNotRun) {
  std::mt19937_64 rng(1);
  auto runs = runs_with("t", 1, 1, 4, 0.5, rng, 0.1);
  std::vector<int> idx = {0, 1, 2, 3}, strata = {0, 0, 0, 0};
  const claim_result r = hierarchical_bootstrap(runs, idx, strata, 10, 1)
                             .evaluate({"x", "", "t", "absent", "all", 1, claim::kind::greater, false});
  EXPECT_EQ(r.verdict, "not run");
}

TEST(AblationCsv, CellsWithCommasAndQuotesRoundTrip) {
  const std::string path = ::testing::TempDir() + "/reco_ablation_csv_test.csv";
  const std::vector<std::string> header = {"config", "label", "k"};
  const std::vector<std::string> row = {"reco_no_cap", "ReCo, no weight cap", "say \"64\""};
  {
    ablation::csv_writer w(path, header);
    w.row(row);
  }
  const ablation::csv_table t = ablation::read_csv(path);
  ASSERT_EQ(t.header, header);
  ASSERT_EQ(t.rows.size(), 1u);
  EXPECT_EQ(t.rows[0], row);
  EXPECT_EQ(ablation::split_csv_line("a,\"b,c\",d").size(), 3u);
  std::remove(path.c_str());
}

}  // namespace
