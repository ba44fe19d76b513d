// Clip-Cov / KL-Cov (reco::covariance_selection, presets clip_cov and kl_cov) against the
// independent reference (values, gradients on both token paths, finite differences with the
// selection frozen), the selection's own rules, bad parameters, and the rejected split step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/compare.hpp"
#include "reco/given_advantages.hpp"
#include "reco/backend/cpu.hpp"
#include "reco/presets.hpp"
#include "reco/step_plan.hpp"

namespace {

using namespace reco_test;

// Parameters under which the selection bites on the small test batches: k > 1 and wide bounds.
template <class Obj>
void biting(Obj& o, reco_ref::config& c, double ratio, double seed) {
  o.select.params.ratio = ratio;
  o.select.params.lb = -0.5;
  o.select.params.ub = 0.8;
  o.select.params.coef = 0.7;
  o.select.params.seed = seed;
  c.cov_ratio = ratio;
  c.cov_lb = -0.5;
  c.cov_ub = 0.8;
  c.cov_coef = 0.7;
  c.cov_seed = seed;
}

// KL-Cov and Clip-Cov with the biting parameters, and their reference configurations.
struct biting_pair {
  reco::presets::kl_cov kc;
  reco_ref::config kcfg = reco_ref::preset("kl_cov");
  reco::presets::clip_cov cc;
  reco_ref::config ccfg = reco_ref::preset("clip_cov");
  biting_pair(double ratio, double seed) {
    biting(kc, kcfg, ratio, seed);
    biting(cc, ccfg, ratio, seed);
  }
};

// verl's defaults (verl/trainer/config/actor/actor.yaml, core_algos.py), docs/presets.md.
TEST(Covariance, PresetConstants) {
  const reco::presets::clip_cov c;
  EXPECT_EQ(c.ratio.params.log_ratio_clamp, 0.0);
  EXPECT_EQ(c.clip.params.eps_low, 0.2);
  EXPECT_EQ(c.clip.params.eps_high, 0.2);
  EXPECT_EQ(c.clip.params.dual_clip, reco::dual_clip_mode::off);
  EXPECT_EQ(c.select.params.mode, reco::covariance_mode::clip);
  EXPECT_EQ(c.select.params.ratio, 2e-4);
  EXPECT_EQ(c.select.params.lb, 1.0);
  EXPECT_EQ(c.select.params.ub, 5.0);
  EXPECT_EQ(c.select.params.seed, 0.0);
  const reco::presets::kl_cov k;
  EXPECT_EQ(k.ratio.params.log_ratio_clamp, 0.0);
  EXPECT_EQ(k.select.params.mode, reco::covariance_mode::kl);
  EXPECT_EQ(k.select.params.ratio, 2e-4);
  EXPECT_EQ(k.select.params.coef, 0.1);
  static_assert(!reco::presets::clip_cov::needs_entropy && !reco::presets::kl_cov::needs_entropy,
                "the covariance needs no entropies");
}

TEST(Covariance, PresetsMatchTheReference) {
  check_against_reference(reco::presets::clip_cov{}, reco_ref::preset("clip_cov"), "clip_cov", 4100);
  check_against_reference(reco::presets::kl_cov{}, reco_ref::preset("kl_cov"), "kl_cov", 4200);
}

TEST(Covariance, BitingParametersMatchTheReference) {
  for (double ratio : {0.05, 0.3, 1.0})
    for (double seed : {0.0, 12345.0}) {
      const std::string tag = " ratio " + std::to_string(ratio) + " seed " + std::to_string(seed);
      reco::presets::clip_cov cc;
      reco_ref::config ccfg = reco_ref::preset("clip_cov");
      biting(cc, ccfg, ratio, seed);
      check_against_reference(cc, ccfg, "clip_cov" + tag, 4300);
      reco::presets::kl_cov kc;
      reco_ref::config kcfg = reco_ref::preset("kl_cov");
      biting(kc, kcfg, ratio, seed);
      check_against_reference(kc, kcfg, "kl_cov" + tag, 4400);
      // Given advantages (the form verl's function takes) against the reference.
      const auto given = reco::with_given_advantages(kc);
      kcfg.adv = reco_ref::advantage::given;
      for (std::uint64_t s = 0; s < 4; ++s) {
        const master_batch m = make_batch(4500 + s, standard_specs()[s * 5]);
        expect_matches(run_library<double>(given, m), reco_ref::evaluate(to_reference(m), kcfg),
                       tolerances_for<double>(), "kl_cov given" + tag);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(Covariance, FiniteDifferencesWithTheSelectionFrozen) {
  for (std::uint64_t seed : {4601u, 4602u, 4603u, 4604u}) {
    reco::presets::clip_cov cc;
    reco_ref::config ccfg = reco_ref::preset("clip_cov");
    biting(cc, ccfg, 0.3, 3.0);
    check_finite_differences(cc, ccfg, "clip_cov", seed, seed % 2 == 0);
    reco::presets::kl_cov kc;
    reco_ref::config kcfg = reco_ref::preset("kl_cov");
    biting(kc, kcfg, 0.3, 3.0);
    check_finite_differences(kc, kcfg, "kl_cov", seed, seed % 2 == 1);
  }
}

// Counts of the selection, read from the diagnostics: Clip-Cov removes exactly
// min(k, candidates) tokens from the policy term; with k at least the candidates the choice is
// every candidate (verl's exactly), whatever the seed; below, seeds choose different subsets.
TEST(Covariance, ClipCovRemovesMinOfKAndTheCandidates) {
  bool saw_subset_differ = false;
  for (std::uint64_t s = 0; s < 12; ++s) {
    const master_batch m = make_batch(4700 + s, standard_specs()[s]);
    reco::presets::clip_cov all;
    all.select.params.ratio = 1.0;
    all.select.params.lb = -1e300;
    all.select.params.ub = 1e300;
    const library_output a0 = run_library<double>(all, m);
    all.select.params.seed = 99;
    const library_output a1 = run_library<double>(all, m);
    EXPECT_EQ(a0.result.loss, a1.result.loss) << "every candidate: the seed does not matter";
    EXPECT_EQ(a0.grad_logp, a1.grad_logp);

    const index_t candidates = a0.result.stats.valid_tokens - a0.result.stats.policy_tokens;
    if (candidates < 3) continue;
    reco::presets::clip_cov some = all;
    // k = floor(ratio N) = candidates - 1.
    some.select.params.ratio = (static_cast<double>(candidates) - 0.5) / static_cast<double>(a0.result.stats.valid_tokens);
    std::vector<std::vector<double>> grads;
    for (double seed : {0.0, 1.0, 2.0, 3.0}) {
      some.select.params.seed = seed;
      const library_output o = run_library<double>(some, m);
      EXPECT_EQ(o.result.stats.valid_tokens - o.result.stats.policy_tokens, candidates - 1);
      EXPECT_EQ(run_library<double>(some, m).grad_logp, o.grad_logp) << "reproducible";
      grads.push_back(o.grad_logp);
    }
    for (std::size_t j = 1; j < grads.size(); ++j) saw_subset_differ |= grads[j] != grads[0];
  }
  EXPECT_TRUE(saw_subset_differ) << "the seed should change the subset somewhere";
}

// Batches of several hundred thousand tokens (a single call selects over several chunks of
// responses and merges them; responses span many blocks of the covariance test), log-probabilities
// on a grid of a few values (many tokens share a covariance, so ties sit on the cut), per-response
// and per-token advantages: the selection against the reference's full sort.
TEST(Covariance, LargeBatchesWithTiesMatchTheReference) {
  for (std::uint64_t s = 0; s < 2; ++s) {
    batch_spec spec;
    spec.groups = 110;
    spec.max_group = 8;
    spec.max_length = 2400;
    spec.padded = s == 1;
    spec.token_advantages = s == 1;
    spec.response_weights = true;
    master_batch m = make_batch(4900 + s, spec);
    for (double& x : m.logp) x = -0.25 * std::round(-x / 0.25);  // a grid of values <= 0
    round_to<float>(m);
    ASSERT_GT(m.logp.size(), std::size_t(1) << 18) << "chunks of responses";
    for (double ratio : {2e-4, 0.3}) {
      const std::string tag = " batch " + std::to_string(s) + " ratio " + std::to_string(ratio);
      biting_pair o(ratio, 7.0);
      auto& kc = o.kc;
      auto& cc = o.cc;
      auto &kcfg = o.kcfg, &ccfg = o.ccfg;
      if (spec.token_advantages) kcfg.adv = ccfg.adv = reco_ref::advantage::given;
      const reco_ref::output kref = reco_ref::evaluate(to_reference(m), kcfg);
      const reco_ref::output cref = reco_ref::evaluate(to_reference(m), ccfg);
      // (KL-Cov's float gradients add the penalty to the rounded policy gradient: on these
      // batches' small gradients that cancellation, not the selection, sets their error.)
      if (spec.token_advantages) {
        expect_matches(run_library<double>(reco::with_given_advantages(kc), m), kref, tolerances_for<double>(),
                       "kl_cov" + tag);
        expect_matches(run_library<float>(reco::with_given_advantages(cc), m), cref, tolerances_for<float>(),
                       "clip_cov float" + tag);
      } else {
        expect_matches(run_library<double>(kc, m), kref, tolerances_for<double>(), "kl_cov" + tag);
        expect_matches(run_library<float>(cc, m), cref, tolerances_for<float>(), "clip_cov float" + tag);
        expect_matches(run_library<double>(cc, m), cref, tolerances_for<double>(), "clip_cov" + tag);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// KL-Cov on a batch whose largest covariances sit exactly at the positions the library samples
// for its streams' least value (covariance_least: S = covariance_samples evenly spaced tokens,
// t_j = floor((2j + 1) N / 2S)), each a distinct value: the sampled bound then admits fewer than k
// tokens, the streams run again without it, and the selection still matches the reference.
TEST(Covariance, ABoundTheSampleSetsTooHighIsDropped) {
  batch_spec spec;
  spec.groups = 110;
  spec.max_group = 8;
  spec.max_length = 2400;
  spec.token_advantages = true;
  master_batch m = make_batch(4990, spec);
  const auto N = static_cast<index_t>(m.logp.size());
  ASSERT_GT(N, index_t(1) << 18) << "the streams start from a sampled bound";
  const index_t S = reco::detail::covariance_samples;
  std::fill(m.logp.begin(), m.logp.end(), -1.0);
  std::fill(m.token_advantages.begin(), m.token_advantages.end(), 0.0);
  for (index_t j = 0; j < S; ++j) {
    const auto t = static_cast<std::size_t>((2 * static_cast<double>(j) + 1) * static_cast<double>(N) / (2.0 * S));
    m.logp[t] = -0.5 * static_cast<double>(j) / static_cast<double>(S);
    m.token_advantages[t] = 1.0;
  }
  for (std::size_t t = 0; t < m.logp.size(); ++t) m.old_logp[t] = m.logp[t] - 0.01;
  round_to<float>(m);
  reco::presets::kl_cov kc;
  reco_ref::config kcfg = reco_ref::preset("kl_cov");
  biting(kc, kcfg, 2e-4, 7.0);
  kcfg.adv = reco_ref::advantage::given;
  const reco_ref::output kref = reco_ref::evaluate(to_reference(m), kcfg);
  expect_matches(run_library<double>(reco::with_given_advantages(kc), m), kref, tolerances_for<double>(), "kl_cov");
  expect_matches(run_library<float>(reco::with_given_advantages(kc), m), kref, tolerances_for<float>(), "kl_cov float");
}

// Clip-Cov and KL-Cov with the advantages per response on a batch whose sampled tokens (the
// positions of covariance_least and of the sampled mean) all hold logp = 0 while the rest of the
// batch lies far below: the sample's mean is 0 with no spread, the exact mean lies outside it, and
// the selection must come from the exact passes (tests on the sampled mean with their tiny margin
// would miss most of the selected tokens).
TEST(Covariance, ASampledMeanOutsideItsSpreadIsNotUsed) {
  batch_spec spec;
  spec.groups = 110;
  spec.max_group = 8;
  spec.max_length = 2400;
  master_batch m = make_batch(4995, spec);
  const auto N = static_cast<index_t>(m.logp.size());
  ASSERT_GT(N, index_t(1) << 18) << "the selection starts from a sampled mean";
  const index_t S = reco::detail::covariance_samples;
  for (double& x : m.logp) x -= 3.0;
  for (index_t j = 0; j < S; ++j) m.logp[static_cast<std::size_t>(reco::detail::sample_position(j, N, S))] = 0.0;
  for (std::size_t t = 0; t < m.logp.size(); ++t) m.old_logp[t] = m.logp[t] - 0.01;
  round_to<float>(m);
  for (double ratio : {2e-4, 0.3}) {
    const std::string tag = " ratio " + std::to_string(ratio);
    const biting_pair o(ratio, 7.0);
    expect_matches(run_library<float>(o.kc, m), reco_ref::evaluate(to_reference(m), o.kcfg), tolerances_for<float>(),
                   "kl_cov" + tag);
    expect_matches(run_library<float>(o.cc, m), reco_ref::evaluate(to_reference(m), o.ccfg), tolerances_for<float>(),
                   "clip_cov" + tag);
  }
}

// The valid tokens that pass `test` in the blocks `hits` marks, appended to `out` in token order
// (what the sampled-mean selection does with the blocks).
template <class T>
void tokens_of_blocks(const reco::detail::covariance_block_hits_fn<T>& test, const std::vector<std::uint64_t>& hits,
                      std::vector<reco::detail::covariance_token>& out) {
  using namespace reco::detail;
  const index_t blocks = (test.e - test.t0 + covariance_block - 1) / covariance_block;
  for (index_t j = 0; j < blocks; ++j) {
    if (!((hits[static_cast<std::size_t>(j / 64)] >> (j % 64)) & 1)) continue;
    for (index_t u = test.t0 + j * covariance_block; u < std::min(test.t0 + (j + 1) * covariance_block, test.e); ++u) {
      if (!test.b.valid(u)) continue;
      const double logp = static_cast<double>(test.b.logp[u]);
      const double cov = token_covariance(test.response_adv, logp, test.m);
      const bool key = (splitmix64(test.seed_bits ^ subset_place(test.response, u - test.t0)) >> 11) < test.key_below;
      if (cov > test.lo && cov <= test.hi && key) out.push_back({u, test.response, logp});
    }
  }
}

// The one loop over a response that gives the sampled-mean selection its sums and block test
// (covariance_response_fn, on packs on the CPU backend) against the two passes it joins: the sums
// bit for bit as the per-response lane sums (which a step plan's summaries add), the blocks hit
// as the block test's, for float and double inputs, packed and padded, keyed or not; with a band
// of every token too, whose keyed loop gathers more positions than its buffer holds at once.
// Returns how many tokens the joined loop listed.
template <class T>
std::size_t expect_one_loop_as_two_passes(const master_batch& m, bool keyed, bool every_token = false) {
  std::size_t listed_tokens = 0;
  using namespace reco::detail;
  const typed_batch<T> tb(m);
  const batch_pointers<T> b = pointers_of(tb.view());
  const reco::cpu be;
  covariance_means means;
  means.adv = 0.1;
  means.logp = -1.3;
  for (index_t i = 0; i < b.layout.responses; ++i) {
    const index_t t0 = b.layout.begin(i), e = b.layout.end(i);
    const index_t words = ((e - t0 + covariance_block - 1) / covariance_block + 63) / 64;
    std::vector<std::uint64_t> one(static_cast<std::size_t>(words) + 1), two(one.size());
    const double a = 0.05 * static_cast<double>(i % 41) - 1.0;
    const double lo = every_token ? -HUGE_VAL : -0.2, hi = every_token ? HUGE_VAL : 0.4;
    covariance_block_hits_fn<T> test{b, a, lo, hi, means, t0, e, one.data()};
    if (keyed) {
      test.keyed = true;
      test.seed_bits = subset_seed(3.0);
      test.key_below = std::uint64_t(1) << 51;
      test.response = i;
    }
    covariance_sums joined;
    be.for_each(1, covariance_response_fn<T>{test, &joined, i});
    covariance_block_hits_fn<T> apart = test;
    apart.hits = two.data();
    if (e > t0) apart(0);
    const covariance_sums sums = host_covariance_sums(b, i);
    const std::string at = "response " + std::to_string(i) + (keyed ? " keyed" : "");
    EXPECT_EQ(std::memcmp(&joined.logp, &sums.logp, sizeof(double)), 0) << at << ": " << joined.logp << " " << sums.logp;
    EXPECT_EQ(joined.n, sums.n) << at;
    for (index_t w = 0; w < words; ++w) EXPECT_EQ(one[static_cast<std::size_t>(w)], two[static_cast<std::size_t>(w)]) << at;
    if (keyed && e > t0) {
      // Given a list, the joined loop may pass its tokens on instead of marking their blocks: the
      // list, then the tokens of the blocks it still marks, are those of the two passes' blocks.
      std::vector<covariance_token> listed, expected;
      std::vector<std::uint64_t> three(one.size());
      covariance_block_hits_fn<T> with_list = test;
      with_list.hits = three.data();
      with_list.passed = &listed;
      covariance_sums unused;
      be.for_each(1, covariance_response_fn<T>{with_list, &unused, i});
      tokens_of_blocks(with_list, three, listed);
      tokens_of_blocks(apart, two, expected);
      EXPECT_EQ(listed.size(), expected.size()) << at;
      if (listed.size() != expected.size()) return listed_tokens;
      listed_tokens += listed.size();
      for (std::size_t k = 0; k < listed.size(); ++k) {
        EXPECT_EQ(listed[k].t, expected[k].t) << at;
        EXPECT_EQ(listed[k].response, expected[k].response) << at;
        EXPECT_EQ(std::memcmp(&listed[k].logp, &expected[k].logp, sizeof(double)), 0) << at;
      }
    }
    if (::testing::Test::HasFailure()) return listed_tokens;
  }
  return listed_tokens;
}

TEST(Covariance, OneReadOfAResponseAsTheTwoPasses) {
  for (std::uint64_t s = 0; s < 2; ++s) {
    batch_spec spec;
    spec.groups = 30;
    spec.max_length = 700;
    spec.padded = s == 1;
    const master_batch m = make_batch(4996 + s, spec);
    for (bool keyed : {false, true}) {
      const std::size_t f = expect_one_loop_as_two_passes<float>(m, keyed);
      const std::size_t d = expect_one_loop_as_two_passes<double>(m, keyed);
      if (keyed) {
        EXPECT_GT(f + d, 0u) << "some tokens pass the keyed test";
      }
    }
  }
  batch_spec spec;
  spec.groups = 2;
  spec.max_length = 5000;
  const master_batch m = make_batch(4998, spec);
  EXPECT_GT(expect_one_loop_as_two_passes<float>(m, true, true), 0u);
  EXPECT_GT(expect_one_loop_as_two_passes<double>(m, true, true), 0u);
}

// Masked tokens get exactly 0 gradient, selected or not.
TEST(Covariance, MaskedTokensGetZeroGradient) {
  for (std::uint64_t s = 0; s < 8; ++s) {
    const master_batch m = make_batch(4800 + s, standard_specs()[2 * s + 1]);
    reco::presets::kl_cov kc;
    kc.select.params.ratio = 1.0;
    reco::presets::clip_cov cc;
    cc.select.params.ratio = 1.0;
    cc.select.params.lb = -1e300;
    for (bool v : {true, false}) {
      const library_output a = run_library<double>(kc, m, {}, v), b = run_library<double>(cc, m, {}, v);
      for (std::size_t t = 0; t < m.mask.size(); ++t)
        if (!m.mask[t]) {
          EXPECT_EQ(a.grad_logp[t], 0.0);
          EXPECT_EQ(b.grad_logp[t], 0.0);
        }
    }
  }
}

std::string bad(void (*set)(reco::presets::kl_cov&)) {
  reco::presets::kl_cov o;
  set(o);
  try {
    o.validate();
  } catch (const reco::error& e) {
    return e.argument();
  }
  return "";
}

TEST(Covariance, BadParametersAreNamed) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  static double v;
  for (double x : {0.0, -0.1, 1.5, nan}) {
    v = x;
    EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.ratio = v; }), "select.params.ratio") << x;
  }
  v = nan;
  EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.lb = v; }), "select.params.lb");
  EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.ub = v; }), "select.params.ub");
  EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.ub = o.select.params.lb; }), "select.params.ub");
  for (double x : {-1.0, inf, nan}) {
    v = x;
    EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.coef = v; }), "select.params.coef") << x;
  }
  for (double x : {inf, nan}) {
    v = x;
    EXPECT_EQ(bad([](reco::presets::kl_cov& o) { o.select.params.seed = v; }), "select.params.seed") << x;
  }
  EXPECT_EQ(bad([](reco::presets::kl_cov&) {}), "");
}

}  // namespace
