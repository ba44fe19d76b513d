// Identities the objectives must satisfy, checked on the library alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "core/random_batch.hpp"
#include "reco/reco.hpp"
#include "reco/batch_ops/entropy_threshold.hpp"

namespace {

using reco::index_t;
using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::typed_batch;

template <class Obj, class T>
reco::objective_result run(const Obj& obj, const reco::batch_view<T>& v, std::vector<T>& g,
                           const reco::normalisers& n = {}) {
  g.assign(static_cast<std::size_t>(v.logp.size()), T(-7));  // poison: every entry must be written
  return obj(reco::cpu{}, v, reco::gradients<T>{g, {}}, n);
}

// On-policy (old_logp == logp, or old_logp absent) the variance and flipped ratios give exactly
// GRPO's loss and gradient: every ratio is 1 and every gradient weight is 1.
TEST(Identities, OnPolicyRatiosEqualGrpo) {
  for (int seed = 0; seed < 12; ++seed) {
    batch_spec spec;
    spec.padded = seed % 2 == 0;
    reco_test::master_batch m = make_batch(100 + seed, spec);
    m.old_logp = m.logp;
    typed_batch<double> tb(m);
    for (bool absent : {false, true}) {
      reco::batch_view<double> v = tb.view();
      if (absent) v.old_logp = {};
      using base = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                   reco::seq_mean_token_mean, reco::kl_penalty>;
      using variance = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
                                       reco::uniform_weight, reco::seq_mean_token_mean, reco::kl_penalty>;
      using flipped = reco::objective<reco::grpo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight,
                                      reco::seq_mean_token_mean, reco::kl_penalty>;
      std::vector<double> g0, g1, g2, g3;
      const auto r0 = run(base{}, v, g0);
      const auto r1 = run(variance{}, v, g1);
      const auto r2 = run(flipped{}, v, g2);
      flipped all;
      all.ratio.params.flip_all = true;
      const auto r3 = run(all, v, g3);
      EXPECT_EQ(r0.loss, r1.loss);
      EXPECT_EQ(r0.loss, r2.loss);
      EXPECT_EQ(r0.loss, r3.loss);
      for (std::size_t t = 0; t < g0.size(); ++t) {
        ASSERT_EQ(g0[t], g1[t]) << "variance ratio, token " << t;
        ASSERT_EQ(g0[t], g2[t]) << "flipped ratio, token " << t;
        ASSERT_EQ(g0[t], g3[t]) << "flipped (all tokens), token " << t;
      }
      EXPECT_EQ(r1.stats.ratio_min, 1.0);
      EXPECT_EQ(r1.stats.ratio_max, 1.0);
    }
  }
}

// Saturated tokens (p = 1 exactly, common with bf16 log-probs) must not produce inf or NaN,
// and the on-policy identity must still hold there.
TEST(Identities, SaturatedTokensStayFinite) {
  reco_test::master_batch m = make_batch(5, batch_spec{});
  for (std::size_t t = 0; t < m.logp.size(); t += 3) m.logp[t] = 0.0;
  m.old_logp = m.logp;
  for (std::size_t t = 1; t < m.logp.size(); t += 7) m.old_logp[t] = 0.0;  // p_old = 1, p < 1
  typed_batch<float> tb(m);
  reco::presets::reco obj;
  std::vector<float> g;
  const auto r = run(obj, tb.view(), g);
  EXPECT_TRUE(std::isfinite(r.loss));
  for (float x : g) ASSERT_TRUE(std::isfinite(x));
}

// Doubling a response's geometric-mean old probability halves its ReCo weight. With REINFORCE
// (no ratio) the gradient of each token is -A c w, so the halving shows in the gradient.
TEST(Identities, DoublingOldProbabilityHalvesWeight) {
  using obj_t = reco::objective<reco::given_advantage, reco::reinforce_ratio, reco::no_clip,
                                reco::expected_count_weight, reco::seq_mean_token_mean>;
  obj_t obj;
  obj.weight.params.cap = 0;  // no cap: the raw weight
  batch_spec spec;
  spec.masked_row = 0;
  reco_test::master_batch m = make_batch(11, spec);
  for (double& x : m.old_logp) x = std::min(x, -1.0);  // room to add log 2
  reco_test::master_batch doubled = m;
  const index_t target = 3;
  for (index_t t = m.begin(target); t < m.end(target); ++t) doubled.old_logp[static_cast<std::size_t>(t)] += std::log(2.0);
  typed_batch<double> a(m), b(doubled);
  std::vector<double> ga, gb;
  run(obj, a.view(), ga);
  run(obj, b.view(), gb);
  int checked = 0;
  for (index_t t = m.begin(target); t < m.end(target); ++t) {
    const auto k = static_cast<std::size_t>(t);
    if (!m.mask[k] || ga[k] == 0.0) continue;
    EXPECT_NEAR(gb[k] / ga[k], 0.5, 1e-12);
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // Other responses are untouched.
  for (index_t t = 0; t < m.begin(target); ++t) EXPECT_EQ(ga[static_cast<std::size_t>(t)], gb[static_cast<std::size_t>(t)]);
}

// The cap holds: no weight exceeds w_max, and capped responses weigh exactly w_max.
TEST(Identities, WeightCapHolds) {
  batch_spec spec;
  spec.masked_row = 0;
  reco_test::master_batch m = make_batch(21, spec);
  for (double& x : m.old_logp) x -= 4.0;  // unlikely responses: raw weights far above 10
  typed_batch<double> tb(m);
  reco::presets::reco capped;
  reco::presets::reco_no_cap free;
  std::vector<double> g;
  const auto rc = run(capped, tb.view(), g);
  const auto rf = run(free, tb.view(), g);
  EXPECT_LE(rc.stats.weight_max, 10.0);
  EXPECT_EQ(rc.stats.weight_max, 10.0);
  EXPECT_GT(rc.stats.weight_cap_hits, 0);
  EXPECT_GT(rf.stats.weight_max, 10.0);
  EXPECT_EQ(rf.stats.weight_cap_hits, 0);
}

// Entropies with many ties at the cut: top_k keeps exactly ceil(rho N), the earliest tied
// tokens first; quantile keeps every tie. The batch exceeds 2^24 tokens (torch.quantile's limit).
TEST(Identities, SelectionConventionsAboveTwoToThe24) {
#if defined(__SANITIZE_ADDRESS__)
  // A scale test: it runs in the main build; under ASan at -O0 it alone took 2.5 minutes of the
  // sanitizer stage (the other core tests, in three shards, 15 s each).
  GTEST_SKIP() << "2^24 tokens: run in the main (unsanitized) build";
#endif
  const index_t R = 4100, T = 4096;  // 16,793,600 tokens > 2^24 = 16,777,216
  static_assert(4100LL * 4096LL > (1LL << 24));
  const index_t N = R * T;
  std::vector<float> logp(static_cast<std::size_t>(N)), H(static_cast<std::size_t>(N)), adv(static_cast<std::size_t>(R), 1.0f);
  for (index_t t = 0; t < N; ++t) {
    logp[static_cast<std::size_t>(t)] = -0.5f;
    H[static_cast<std::size_t>(t)] = static_cast<float>((t * 7919) % 1000) / 1000.0f;  // 1000 levels: heavy ties
  }
  std::vector<index_t> groups(static_cast<std::size_t>(R) + 1);
  for (index_t i = 0; i <= R; ++i) groups[static_cast<std::size_t>(i)] = i;
  reco::batch_view<float> v;
  v.layout = reco::padded(R, T);
  v.group_offsets = groups;
  v.logp = logp;
  v.entropy = H;
  v.advantages = adv;
  using obj_t = reco::objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                reco::token_mean, reco::top_entropy_selection>;
  obj_t obj;
  obj.select.params.rho = 0.2;
  std::vector<float> g(static_cast<std::size_t>(N));
  reco::workspace<reco::cpu> ws;
  const auto r = obj(reco::cpu{}, v, reco::gradients<float>{g, {}}, ws);
  const index_t k = static_cast<index_t>(std::ceil(0.2 * static_cast<double>(N) * (1 - 1e-12)));
  EXPECT_EQ(r.stats.policy_tokens, k);
  // Reconstruct the cut: every token above it kept, the tied ones kept in position order.
  std::vector<index_t> count(1000, 0);
  for (float h : H) ++count[static_cast<std::size_t>(std::lround(h * 1000.0f))];
  index_t above = 0;
  int level = 999;
  while (above + count[static_cast<std::size_t>(level)] < k) above += count[static_cast<std::size_t>(level--)];
  const index_t ties = k - above;
  index_t seen_ties = 0;
  bool order_ok = true;
  for (index_t t = 0; t < N; ++t) {
    const int lv = static_cast<int>(std::lround(H[static_cast<std::size_t>(t)] * 1000.0f));
    const bool kept = g[static_cast<std::size_t>(t)] != 0.0f;
    bool expect = lv > level;
    if (lv == level) expect = seen_ties++ < ties;
    if (kept != expect) order_ok = false;
  }
  EXPECT_TRUE(order_ok);
  // Denominator "valid": the policy term divides by all N tokens; "kept" by the k kept ones.
  // (Float inputs: each term is a float product, within a few u = 2^-24 of its value;
  // docs/conventions.md, "Precision".)
  EXPECT_NEAR(r.policy_loss, -static_cast<double>(k) / static_cast<double>(N), 4e-7);
  obj.select.params.denominator = reco::selection_denominator::kept;
  const auto rk = obj(reco::cpu{}, v, reco::gradients<float>{g, {}}, ws);
  EXPECT_NEAR(rk.policy_loss, -1.0, 4e-7);
  // Quantile rule: every tie at the cut survives, so at least k tokens are kept.
  obj.select.params.rule = reco::selection_rule::quantile;
  obj.select.params.denominator = reco::selection_denominator::valid;
  const auto rq = obj(reco::cpu{}, v, reco::gradients<float>{g, {}}, ws);
  index_t quantile_kept = 0;
  for (float x : g) quantile_kept += x != 0.0f;
  EXPECT_EQ(rq.stats.policy_tokens, quantile_kept);
  EXPECT_GE(quantile_kept, k);
  // It keeps whole tie levels: the count is a sum of level counts from the top.
  index_t levels_sum = 0;
  int l = 999;
  while (levels_sum < quantile_kept) levels_sum += count[static_cast<std::size_t>(l--)];
  EXPECT_EQ(levels_sum, quantile_kept);
}

// Splitting a batch in two and passing global normalisers reproduces the whole batch's loss and
// gradient, for every aggregation (the constant of seq_mean_token_sum_norm given globally).
template <class Obj>
void check_split(Obj obj, bool padded, std::uint64_t seed, bool use_selection) {
  batch_spec spec;
  spec.padded = padded;
  spec.groups = 8;
  reco_test::master_batch m = make_batch(seed, spec);
  typed_batch<double> whole(m);
  reco::workspace<reco::cpu> ws;
  if constexpr (Obj::selector_type::active) {
    if (use_selection) {
      obj.select.params.given = reco::entropy_threshold(reco::cpu{}, reco::span<const double>(whole.entropy),
                                                        reco::span<const std::uint8_t>(whole.mask),
                                                        obj.select.params, ws);
      obj.select.params.given.ties = -1;
      obj.select.params.use_given = true;
    }
  }
  std::vector<double> g_whole;
  const auto r_whole = run(obj, whole.view(), g_whole);

  // Split at a group boundary.
  const index_t P = static_cast<index_t>(m.group_offsets.size()) - 1, gsplit = P / 2;
  const index_t rsplit = m.group_offsets[static_cast<std::size_t>(gsplit)];
  auto part = [&](index_t r0, index_t r1, index_t g0, index_t g1) {
    reco_test::master_batch p;
    p.padded = m.padded;
    p.T = m.T;
    p.R = r1 - r0;
    const index_t t0 = m.begin(r0), t1 = r1 > r0 ? m.end(r1 - 1) : t0;
    p.N = t1 - t0;
    if (!m.padded) {
      p.offsets.push_back(0);
      for (index_t i = r0; i < r1; ++i) p.offsets.push_back(p.offsets.back() + m.end(i) - m.begin(i));
    }
    for (index_t g = g0; g <= g1; ++g) p.group_offsets.push_back(m.group_offsets[static_cast<std::size_t>(g)] - r0);
    auto slice = [&](const std::vector<double>& v, index_t a, index_t b) {
      return std::vector<double>(v.begin() + a, v.begin() + b);
    };
    p.logp = slice(m.logp, t0, t1);
    p.old_logp = slice(m.old_logp, t0, t1);
    p.ref_logp = slice(m.ref_logp, t0, t1);
    p.entropy = slice(m.entropy, t0, t1);
    p.mask = std::vector<std::uint8_t>(m.mask.begin() + t0, m.mask.begin() + t1);
    p.rewards = slice(m.rewards, r0, r1);
    p.advantages = slice(m.advantages, r0, r1);
    if (!m.response_weights.empty()) p.response_weights = slice(m.response_weights, r0, r1);
    return p;
  };
  reco_test::master_batch a = part(0, rsplit, 0, gsplit), b = part(rsplit, m.R, gsplit, P);
  reco::normalisers n;
  n.tokens = r_whole.stats.valid_tokens;
  n.responses = r_whole.stats.nonempty_responses;
  n.kept_tokens = r_whole.stats.policy_tokens;
  // Responses with at least one kept token (every valid token without a selector).
  index_t kept_responses = 0;
  for (index_t i = 0; i < m.R; ++i) {
    bool any = false;
    for (index_t t = m.begin(i); t < m.end(i); ++t) {
      const auto k = static_cast<std::size_t>(t);
      bool kept = m.mask[k] != 0;
      if constexpr (Obj::selector_type::active)
        if (use_selection) kept = kept && m.entropy[k] >= obj.select.params.given.value;
      any = any || kept;
    }
    kept_responses += any;
  }
  n.kept_responses = kept_responses;
  if constexpr (std::is_same_v<typename Obj::aggregate_type, reco::seq_mean_token_sum_norm>)
    obj.aggregate.params.constant = static_cast<double>(m.R) * static_cast<double>(padded ? m.T : 12);
  const auto r_whole2 = run(obj, whole.view(), g_whole, n);
  typed_batch<double> ta(a), tb(b);
  std::vector<double> ga, gb;
  const auto ra = run(obj, ta.view(), ga, n);
  const auto rb = run(obj, tb.view(), gb, n);
  EXPECT_NEAR(ra.loss + rb.loss, r_whole2.loss, 1e-12 * (1 + std::fabs(r_whole2.loss)));
  ga.insert(ga.end(), gb.begin(), gb.end());
  ASSERT_EQ(ga.size(), g_whole.size());
  for (std::size_t t = 0; t < ga.size(); ++t) ASSERT_NEAR(ga[t], g_whole[t], 1e-14 + 1e-12 * std::fabs(g_whole[t]));
}

TEST(Identities, SplitBatchWithGlobalNormalisers) {
  for (bool padded : {false, true}) {
    for (std::uint64_t seed : {31u, 32u, 33u}) {
      check_split(reco::presets::grpo{}, padded, seed, false);
      check_split(reco::presets::reco{}, padded, seed, false);
      check_split(reco::presets::dapo{}, padded, seed, false);
      check_split(reco::presets::dr_grpo{}, padded, seed, false);
      check_split(reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                  reco::seq_mean_token_sum>{},
                  padded, seed, false);
      check_split(reco::presets::rule_80_20_reco{}, padded, seed, true);
      reco::presets::rule_80_20 kept;
      kept.select.params.denominator = reco::selection_denominator::kept;
      check_split(kept, padded, seed, true);
      using seq_kept_t = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                         reco::seq_mean_token_mean, reco::top_entropy_selection>;
      seq_kept_t seq_kept;
      seq_kept.select.params.denominator = reco::selection_denominator::kept;
      check_split(seq_kept, padded, seed, true);
    }
  }
}

// Repeated CPU runs give bitwise identical results, whatever the thread count. (About 140K
// tokens: above reco::cpu::serial_below, so the token pass's chunks run on the OpenMP team.)
TEST(Identities, BitwiseDeterministic) {
  batch_spec spec;
  spec.groups = 120;
  spec.max_length = 300;
  reco_test::master_batch m = make_batch(77, spec);
  typed_batch<float> tb(m);
  auto once = [&](auto obj, std::vector<float>& g) { return run(obj, tb.view(), g); };
  auto same = [&](auto obj) {
    std::vector<float> g1, g2;
    const auto a = once(obj, g1);
#if defined(_OPENMP)
    const int threads = omp_get_max_threads();
    omp_set_num_threads(threads > 1 ? 1 : 2);
#endif
    const auto b = once(obj, g2);
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#endif
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a.stats, &b.stats, sizeof(a.stats)), 0);
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0);
  };
  same(reco::presets::reco{});
  same(reco::presets::rule_80_20_reco{});
  same(reco::presets::gspo{});
  same(reco::presets::aspo{});
}

// Where the token pass computes ReCo's response weights itself (a capped weight, normalised by
// nothing, of a call of its own: old_logp is then read once), it sums each response's old_logp as
// the response scan does, so it gives the bits of the group pass's weights: an uncapped weight
// (cap 0, computed by the group pass) against a cap no weight reaches (computed by the token
// pass), over responses of up to 3,000 tokens that cross the pass's chunks of 8,192, masked rows
// among them, on float and double inputs, one and two threads, old_logp or the rollout log-probs
// averaged.
TEST(Identities, WeightsOfTheTokenPassAreTheGroupPassWeights) {
  batch_spec spec;
  spec.groups = 12;
  spec.max_group = 8;
  spec.max_length = 3000;
  spec.masked_row = 0.2;
  const reco_test::master_batch m = make_batch(79, spec);
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::vector<double> rollout(m.logp.size());
  for (std::size_t t = 0; t < rollout.size(); ++t) rollout[t] = std::min(-1e-4, m.old_logp[t] + noise(rng) - 1.0);
  auto check = [&](auto zero, bool from_rollout, int threads) {
    using T = decltype(zero);
    SCOPED_TRACE(std::string(std::is_same_v<T, float> ? "float" : "double") + (from_rollout ? ", rollout" : ", old") +
                 ", threads " + std::to_string(threads));
    typed_batch<T> tb(m);
    const std::vector<T> rollout_t(rollout.begin(), rollout.end());
    reco::batch_view<T> v = tb.view();
    if (from_rollout) v.rollout_logp = rollout_t;
#if defined(_OPENMP)
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    auto call = [&](double cap, std::vector<T>& g) {
      reco::presets::reco obj;
      obj.weight.params.cap = cap;
      if (from_rollout) obj.weight.params.sampling = reco::weight_sampling::rollout;
      return run(obj, v, g);
    };
    std::vector<T> g_pass, g_group;
    const auto in_pass = call(1e300, g_pass);
    const auto in_group = call(0.0, g_group);
#if defined(_OPENMP)
    omp_set_num_threads(before);
#endif
    EXPECT_GT(in_group.stats.weight_max, 1.0) << "weights above 1 (the test would not see a missing weight)";
    EXPECT_EQ(std::memcmp(&in_pass.loss, &in_group.loss, sizeof(double)), 0) << in_pass.loss << " vs " << in_group.loss;
    EXPECT_EQ(std::memcmp(&in_pass.stats, &in_group.stats, sizeof(in_pass.stats)), 0)
        << "weight mean " << in_pass.stats.weight_mean << " vs " << in_group.stats.weight_mean << ", min "
        << in_pass.stats.weight_min << " vs " << in_group.stats.weight_min << ", max " << in_pass.stats.weight_max
        << " vs " << in_group.stats.weight_max;
    EXPECT_EQ(std::memcmp(g_pass.data(), g_group.data(), g_pass.size() * sizeof(T)), 0);
  };
  ASSERT_GT(m.logp.size(), 3u * 8192u);
  for (int threads : {1, 2})
    for (bool from_rollout : {false, true}) {
      check(0.0f, from_rollout, threads);
      check(0.0, from_rollout, threads);
    }
}

// A call without token diagnostics gives the losses and gradients of a call with them, bit for
// bit (the packed pass adds the same blocks either way), on float and double inputs.
TEST(Identities, DiagnosticsDoNotChangeLossesOrGradients) {
  batch_spec spec;
  spec.groups = 30;
  spec.max_length = 700;
  spec.token_weights = true;
  const reco_test::master_batch m = make_batch(78, spec);
  auto check = [&](auto obj, auto zero, const std::string& name) {
    using T = decltype(zero);
    SCOPED_TRACE(name);
    typed_batch<T> tb(m);
    const bool eg = obj.needs().entropy_gradient;
    auto call = [&](bool diagnostics, std::vector<T>& g, std::vector<T>& gh) {
      g.assign(m.logp.size(), T(-7));
      gh.assign(m.logp.size(), T(-7));
      reco::cpu be;
      be.diagnostics = diagnostics;
      reco::workspace<reco::cpu> ws;
      return obj(be, tb.view(), reco::gradients<T>{g, eg ? reco::span<T>(gh) : reco::span<T>()}, ws);
    };
    std::vector<T> g1, gh1, g2, gh2;
    const auto a = call(true, g1, gh1);
    const auto b = call(false, g2, gh2);
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
    EXPECT_EQ(std::memcmp(&a.policy_loss, &b.policy_loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a.kl_loss, &b.kl_loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a.entropy_loss, &b.entropy_loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a.stats.ref_kl_mean, &b.stats.ref_kl_mean, sizeof(double)), 0);
    EXPECT_EQ(a.stats.valid_tokens, b.stats.valid_tokens);
    EXPECT_EQ(a.stats.policy_tokens, b.stats.policy_tokens);
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(T)), 0);
    if (eg) {
      EXPECT_EQ(std::memcmp(gh1.data(), gh2.data(), gh1.size() * sizeof(T)), 0);
    }
    EXPECT_EQ(b.stats.ppo_kl, 0.0) << "no diagnostics: they read 0";
    EXPECT_EQ(b.stats.entropy_mean, 0.0) << "no diagnostics: they read 0";
  };
  check(reco::presets::grpo{}, 0.0f, "grpo float");
  check(reco::presets::reco{}, 0.0f, "reco float");
  check(reco::presets::rule_80_20{}, 0.0f, "rule_80_20 float");
  check(reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                        reco::token_mean, reco::entropy_bonus, reco::kl_penalty>{},
        0.0f, "entropy bonus float");
  // Without diagnostics a call reads the entropies only for what needs them: the bonus above,
  // an entropy-split clip here.
  check(reco::objective<reco::grpo_advantage, reco::token_ratio, reco::entropy_split_clip, reco::uniform_weight,
                        reco::token_mean>{},
        0.0f, "entropy-split clip float");
  check(reco::presets::grpo{}, 0.0, "grpo double");
  check(reco::presets::reco{}, 0.0, "reco double");
}

// Masked and padding tokens receive exactly zero gradient (and entropy gradient).
TEST(Identities, MaskedTokensGetZeroGradient) {
  batch_spec spec;
  spec.padded = true;
  spec.masked_row = 0.3;
  spec.mask_hole = 0.3;
  reco_test::master_batch m = make_batch(91, spec);
  typed_batch<double> tb(m);
  reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::expected_count_weight,
                  reco::seq_mean_token_mean, reco::kl_penalty, reco::entropy_bonus>
      obj;
  std::vector<double> g(m.logp.size(), -3.0), gh(m.logp.size(), -3.0);
  obj(reco::cpu{}, tb.view(), reco::gradients<double>{g, gh});
  index_t masked = 0;
  for (std::size_t t = 0; t < g.size(); ++t) {
    if (m.mask[t]) continue;
    ++masked;
    ASSERT_EQ(g[t], 0.0);
    ASSERT_EQ(gh[t], 0.0);
    ASSERT_FALSE(std::signbit(g[t]));
  }
  EXPECT_GT(masked, 0);
}

}  // namespace
