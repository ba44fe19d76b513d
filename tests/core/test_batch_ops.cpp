// Batch helpers: group filters with compaction, overlong shaping, truncation masking, prompt
// grouping, KL in the reward, the population cut of the 80/20 rule, ReMax, GAE and OTB advantages;
// and verl's grpo_passk rule on pass_at_k_advantage's group stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <cmath>
#include <random>
#include <vector>

#include "core/named_argument.hpp"
#include "core/random_batch.hpp"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/batch_ops/gae.hpp"
#include "reco/batch_ops/kl_reward.hpp"
#include "reco/batch_ops/optimal_token_baseline.hpp"
#include "reco/batch_ops/overlong_penalty.hpp"
#include "reco/batch_ops/prompt_groups.hpp"
#include "reco/batch_ops/remax.hpp"
#include "reco/batch_ops/truncation_mask.hpp"
#include "reco/reco.hpp"
#include "reco/batch_ops/entropy_threshold.hpp"

namespace {

using reco::index_t;

TEST(BatchOps, FilterNonzeroStdAndCompaction) {
  // groups: {1,1,1} dropped, {0,1} kept, {5} singleton kept, {0,0} dropped, {2,3,2} kept
  std::vector<double> rewards = {1, 1, 1, 0, 1, 5, 0, 0, 2, 3, 2};
  std::vector<index_t> groups = {0, 3, 5, 6, 8, 11};
  std::vector<index_t> kept(rewards.size()), kept_groups(groups.size());
  reco::workspace<reco::cpu> ws;
  const auto c = reco::filter_groups(reco::cpu{}, reco::span<const double>(rewards), reco::span<const index_t>(groups),
                                     reco::group_filter_params{}, reco::span<index_t>(kept),
                                     reco::span<index_t>(kept_groups), ws);
  ASSERT_EQ(c.groups, 3);
  ASSERT_EQ(c.responses, 6);
  EXPECT_EQ(std::vector<index_t>(kept.begin(), kept.begin() + 6), (std::vector<index_t>{3, 4, 5, 8, 9, 10}));
  EXPECT_EQ(std::vector<index_t>(kept_groups.begin(), kept_groups.begin() + 4), (std::vector<index_t>{0, 2, 3, 6}));

  // Singletons dropped on request.
  reco::group_filter_params strict;
  strict.keep_singletons = false;
  const auto c2 = reco::filter_groups(reco::cpu{}, reco::span<const double>(rewards), reco::span<const index_t>(groups),
                                      strict, reco::span<index_t>(kept), reco::span<index_t>(kept_groups), ws);
  EXPECT_EQ(c2.groups, 2);
  EXPECT_EQ(c2.responses, 5);

  // Per-response and packed per-token compaction.
  std::vector<index_t> offsets = {0};
  for (std::size_t i = 0; i < rewards.size(); ++i) offsets.push_back(offsets.back() + static_cast<index_t>(i % 4));
  std::vector<float> token_values(static_cast<std::size_t>(offsets.back()));
  for (std::size_t t = 0; t < token_values.size(); ++t) token_values[t] = static_cast<float>(t);
  std::vector<index_t> new_offsets(static_cast<std::size_t>(c.responses) + 1);
  const index_t n_new = reco::compact_token_offsets(reco::cpu{}, reco::span<const index_t>(offsets),
                                                    reco::span<const index_t>(kept), c2.responses,
                                                    reco::span<index_t>(new_offsets), ws);
  std::vector<float> expected;
  for (index_t j = 0; j < c2.responses; ++j)
    for (index_t t = offsets[static_cast<std::size_t>(kept[static_cast<std::size_t>(j)])];
         t < offsets[static_cast<std::size_t>(kept[static_cast<std::size_t>(j)]) + 1]; ++t)
      expected.push_back(static_cast<float>(t));
  ASSERT_EQ(n_new, static_cast<index_t>(expected.size()));
  std::vector<float> out(static_cast<std::size_t>(n_new));
  reco::gather_tokens(reco::cpu{}, reco::span<const float>(token_values), reco::span<const index_t>(offsets),
                      reco::span<const index_t>(new_offsets), reco::span<const index_t>(kept), c2.responses,
                      reco::span<float>(out));
  EXPECT_EQ(out, expected);
  std::vector<double> kept_rewards(static_cast<std::size_t>(c2.responses));
  reco::gather_responses(reco::cpu{}, reco::span<const double>(rewards), reco::span<const index_t>(kept), c2.responses,
                         reco::span<double>(kept_rewards));
  EXPECT_EQ(kept_rewards, (std::vector<double>{0, 1, 2, 3, 2}));
  // Padded rows.
  std::vector<int> rows(rewards.size() * 3);
  for (std::size_t k = 0; k < rows.size(); ++k) rows[k] = static_cast<int>(k);
  std::vector<int> rows_out(static_cast<std::size_t>(c2.responses) * 3);
  reco::gather_rows(reco::cpu{}, reco::span<const int>(rows), 3, reco::span<const index_t>(kept), c2.responses,
                    reco::span<int>(rows_out));
  EXPECT_EQ(rows_out[0], 9);  // row 3
  EXPECT_EQ(rows_out[14], 32);  // row 10, column 2
}

TEST(BatchOps, FilterMeanInRange) {
  std::vector<float> rewards = {1, 1, 0, 1, 0, 0, 0.5f};
  std::vector<index_t> groups = {0, 2, 4, 6, 7};  // means 1, 0.5, 0, 0.5
  std::vector<index_t> kept(rewards.size()), kept_groups(groups.size());
  reco::workspace<reco::cpu> ws;
  reco::group_filter_params p;
  p.rule = reco::group_filter_rule::mean_in_range;
  p.low = 0.0;
  p.high = 1.0;
  const auto c = reco::filter_groups(reco::cpu{}, reco::span<const float>(rewards), reco::span<const index_t>(groups), p,
                                     reco::span<index_t>(kept), reco::span<index_t>(kept_groups), ws);
  EXPECT_EQ(c.groups, 2);
  EXPECT_EQ(std::vector<index_t>(kept.begin(), kept.begin() + c.responses), (std::vector<index_t>{2, 3, 6}));
}

TEST(BatchOps, OverlongPenalty) {
  reco::overlong_params p;
  p.max_length = 100;
  p.buffer = 20;
  p.factor = 0.5;
  std::vector<index_t> lengths = {10, 80, 90, 100, 110};
  std::vector<double> rewards = {1, 1, 1, 1, 1};
  reco::add_overlong_penalty(reco::cpu{}, reco::span<const index_t>(lengths), p, reco::span<double>(rewards));
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const double L = static_cast<double>(lengths[i]);
    const double expected = 1.0 + std::min(-(L - (100.0 - 20.0)) / 20.0 * 0.5, 0.0);
    EXPECT_DOUBLE_EQ(rewards[i], expected) << "length " << L;
  }
  EXPECT_DOUBLE_EQ(rewards[3], 0.5);  // at L_max: -factor
  // Lengths from a layout and mask.
  std::vector<std::uint8_t> mask = {1, 1, 0, 1, 0, 0, 1, 1, 1};
  std::vector<index_t> got(3);
  reco::response_lengths(reco::cpu{}, reco::padded(3, 3), reco::span<const std::uint8_t>(mask), reco::span<index_t>(got));
  EXPECT_EQ(got, (std::vector<index_t>{2, 1, 3}));
}

TEST(BatchOps, TruncatedCompletionsDropOut) {
  const int eos = 2;
  std::vector<int> tokens = {5, 6, 2, 0, 7, 8, 9, 9, 2, 0, 0, 0};
  std::vector<std::uint8_t> mask = {1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0};
  std::vector<std::uint8_t> out(tokens.size());
  reco::mask_truncated(reco::cpu{}, reco::padded(3, 4), reco::span<const int>(tokens),
                       reco::span<const std::uint8_t>(mask), eos, reco::span<std::uint8_t>(out));
  EXPECT_EQ(out, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0}));
  // A truncated response then counts for nothing: same loss as dropping it from the batch.
  std::vector<double> logp(12, -0.3), rewards = {1, 0, 1};
  std::vector<index_t> groups = {0, 3};
  reco::batch_view<double> v;
  v.layout = reco::padded(3, 4);
  v.group_offsets = groups;
  v.logp = logp;
  v.rewards = rewards;
  v.mask = out;
  std::vector<double> g(12);
  reco::presets::dapo obj;
  const auto r = obj(reco::cpu{}, v, reco::gradients<double>{g, {}});
  EXPECT_EQ(r.stats.valid_tokens, 4);
  for (int t = 4; t < 8; ++t) EXPECT_EQ(g[static_cast<std::size_t>(t)], 0.0);
}

TEST(BatchOps, PromptGrouping) {
  std::vector<long> ids = {4, 4, 9, 1, 1, 1};
  EXPECT_EQ(reco::group_offsets_from_prompt_ids(reco::span<const long>(ids)), (std::vector<index_t>{0, 2, 3, 6}));
  std::vector<long> none;
  EXPECT_EQ(reco::group_offsets_from_prompt_ids(reco::span<const long>(none)), (std::vector<index_t>{0}));
  std::vector<long> mixed = {7, 3, 7, 5, 3};
  const auto g = reco::group_by_prompt(reco::span<const long>(mixed));
  EXPECT_EQ(g.order, (std::vector<index_t>{0, 2, 1, 4, 3}));
  EXPECT_EQ(g.group_offsets, (std::vector<index_t>{0, 2, 4, 5}));
  std::vector<long> reordered;
  for (index_t j : g.order) reordered.push_back(mixed[static_cast<std::size_t>(j)]);
  EXPECT_EQ(reco::group_offsets_from_prompt_ids(reco::span<const long>(reordered)), g.group_offsets);
}

TEST(BatchOps, KlInReward) {
  reco_test::batch_spec spec;
  reco_test::master_batch m = reco_test::make_batch(3, spec);
  reco_test::typed_batch<double> tb(m);
  std::vector<double> rewards = tb.rewards;
  reco::kl_penalty kl;
  kl.params.beta = 0.05;
  reco::subtract_kl_from_rewards(reco::cpu{}, tb.view(), kl, reco::span<double>(rewards));
  for (index_t i = 0; i < m.R; ++i) {
    double sum = 0;
    for (index_t t = m.begin(i); t < m.end(i); ++t) {
      const auto k = static_cast<std::size_t>(t);
      if (!m.mask[k]) continue;
      const double d = m.logp[k] - m.ref_logp[k];
      sum += std::exp(-d) + d - 1.0;  // k3, far from its clamps here
    }
    EXPECT_NEAR(rewards[static_cast<std::size_t>(i)], m.rewards[static_cast<std::size_t>(i)] - 0.05 * sum, 1e-12);
  }
}

TEST(BatchOps, PopulationCut) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 4);
  std::vector<double> h(1001);
  for (double& x : h) x = u(rng);
  std::vector<std::uint8_t> mask(h.size(), 1);
  for (std::size_t t = 0; t < mask.size(); t += 10) mask[t] = 0;
  std::vector<double> valid;
  for (std::size_t t = 0; t < h.size(); ++t)
    if (mask[t]) valid.push_back(h[t]);
  std::sort(valid.begin(), valid.end());
  reco::workspace<reco::cpu> ws;
  reco::top_entropy_selection::params_type p;
  p.rho = 0.2;
  const auto cut = reco::entropy_threshold(reco::cpu{}, reco::span<const double>(h), reco::span<const std::uint8_t>(mask), p, ws);
  const std::size_t k = static_cast<std::size_t>(std::ceil(0.2 * static_cast<double>(valid.size()) * (1 - 1e-12)));
  EXPECT_EQ(cut.value, valid[valid.size() - k]);
  EXPECT_EQ(cut.ties, 1);
  p.rule = reco::selection_rule::quantile;
  const auto q = reco::entropy_threshold(reco::cpu{}, reco::span<const double>(h), reco::span<const std::uint8_t>(mask), p, ws);
  const double pos = 0.8 * static_cast<double>(valid.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  EXPECT_NEAR(q.value, valid[lo] + (pos - static_cast<double>(lo)) * (valid[lo + 1] - valid[lo]), 1e-15);
  EXPECT_EQ(q.ties, -1);
}

using reco_test::named_argument;

TEST(BatchOps, RemaxAdvantages) {
  reco::workspace<reco::cpu> ws;
  std::vector<double> r = {1.0, 0.5, 0.0, 2.0}, b = {0.5, 0.5, 1.0, -1.0}, a(4);
  reco::remax_advantages(reco::cpu{}, reco::span<const double>(r), reco::span<const double>(b), reco::span<double>(a), ws);
  EXPECT_EQ(a, (std::vector<double>{0.5, 0.0, -1.0, 3.0}));
  std::vector<float> rf = {0.25f, -3.0f}, bf = {1.0f, -1.0f};  // in place, float
  reco::remax_advantages(reco::cpu{}, reco::span<const float>(rf), reco::span<const float>(bf), reco::span<float>(rf), ws);
  EXPECT_EQ(rf, (std::vector<float>{-0.75f, -2.0f}));
  std::vector<double> empty;
  reco::remax_advantages(reco::cpu{}, reco::span<const double>(empty), reco::span<const double>(empty),
                         reco::span<double>(empty), ws);

  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto call = [&](std::vector<double> rr, std::vector<double> bb, std::size_t out) {
    std::vector<double> o(out);
    return named_argument([&] {
      reco::remax_advantages(reco::cpu{}, reco::span<const double>(rr), reco::span<const double>(bb),
                             reco::span<double>(o), ws);
    });
  };
  EXPECT_EQ(call({1, nan}, {0, 0}, 2), "rewards");
  EXPECT_EQ(call({1, 2}, {std::numeric_limits<double>::infinity(), 0}, 2), "baselines");
  EXPECT_EQ(call({1, 2}, {0}, 2), "baselines");
  EXPECT_EQ(call({1, 2}, {0, 0}, 3), "advantages");
  EXPECT_EQ(call({1, 2}, {0, 0}, 2), "");
}

// Naive GAE on one response's token range (sum form, not the recursion): over the valid tokens
// u_0 < u_1 < ..., delta_j = r(u_j) + gamma V(u_{j+1}) - V(u_j) (V = 0 past the last) and
// A(u_j) = sum_{k >= j} (gamma lambda)^(k - j) delta_k; masked tokens 0.
void gae_reference(const std::vector<double>& r, const std::vector<double>& v, const std::vector<std::uint8_t>& mask,
                   std::size_t begin, std::size_t end, double gamma, double lambda, std::vector<double>& adv,
                   std::vector<double>& ret) {
  std::vector<std::size_t> u;
  for (std::size_t t = begin; t < end; ++t) {
    if (mask[t]) u.push_back(t);
    adv[t] = 0;
    ret[t] = 0;
  }
  std::vector<double> delta(u.size());
  for (std::size_t j = 0; j < u.size(); ++j)
    delta[j] = r[u[j]] + gamma * (j + 1 < u.size() ? v[u[j + 1]] : 0.0) - v[u[j]];
  for (std::size_t j = 0; j < u.size(); ++j) {
    double a = 0;
    for (std::size_t k = j; k < u.size(); ++k) a += std::pow(gamma * lambda, static_cast<double>(k - j)) * delta[k];
    adv[u[j]] = a;
    ret[u[j]] = a + v[u[j]];
  }
}

TEST(BatchOps, GaeHandComputed) {
  // One response, 3 tokens, gamma = lambda = 0.5, outcome reward 1 on the last token:
  // t=2: delta 0.7, A 0.7; t=1: delta -0.05, A 0.125; t=0: delta 0, A 0.03125; R = A + V.
  reco::workspace<reco::cpu> ws;
  std::vector<double> r = {0, 0, 1}, v = {0.1, 0.2, 0.3}, a(3), ret(3);
  reco::gae_params p;
  p.gamma = 0.5;
  p.lambda = 0.5;
  p.whiten = false;
  reco::gae_advantages(reco::cpu{}, reco::padded(1, 3), reco::span<const double>(r), reco::span<const double>(v),
                       reco::span<const std::uint8_t>(), p, reco::span<double>(a), reco::span<double>(ret), ws);
  EXPECT_NEAR(a[0], 0.03125, 1e-15);
  EXPECT_NEAR(a[1], 0.125, 1e-15);
  EXPECT_NEAR(a[2], 0.7, 1e-15);
  EXPECT_NEAR(ret[0], 0.13125, 1e-15);
  EXPECT_NEAR(ret[1], 0.325, 1e-15);
  EXPECT_NEAR(ret[2], 1.0, 1e-15);

  // Whitened over the 3 tokens with the unbiased variance and eps 1e-8 under the root.
  p.whiten = true;
  reco::gae_advantages(reco::cpu{}, reco::padded(1, 3), reco::span<const double>(r), reco::span<const double>(v),
                       reco::span<const std::uint8_t>(), p, reco::span<double>(a), reco::span<double>(ret), ws);
  const double raw[3] = {0.03125, 0.125, 0.7};
  const double mean = (raw[0] + raw[1] + raw[2]) / 3;
  double ss = 0;
  for (double x : raw) ss += (x - mean) * (x - mean);
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(a[static_cast<std::size_t>(t)], (raw[t] - mean) / std::sqrt(ss / 2 + 1e-8), 1e-12);
  EXPECT_NEAR(ret[2], 1.0, 1e-15);  // returns stay unwhitened
}

TEST(BatchOps, GaeRaggedPaddedAndPacked) {
  // Ragged responses in a padded [R, T] layout, one with a masked token inside (an observation
  // span of a multi-turn response) and one with no valid token; the same data packed.
  const std::vector<std::size_t> lengths = {5, 2, 7, 0, 4};
  const std::size_t R = lengths.size(), T = 7;
  std::mt19937 rng(11);
  std::normal_distribution<double> g(0, 1);
  std::vector<double> r(R * T), v(R * T);
  std::vector<std::uint8_t> mask(R * T, 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t k = i * T + t;
      mask[k] = t < lengths[i] ? 1 : 0;
      r[k] = mask[k] ? g(rng) : nan;  // masked entries are never read
      v[k] = mask[k] ? g(rng) : nan;
    }
  mask[2 * T + 3] = 0;
  mask[2 * T + 4] = 0;
  r[2 * T + 3] = nan;
  for (const double gamma : {1.0, 0.9}) {
    for (const double lambda : {1.0, 0.95, 0.0}) {
      for (const bool whiten : {false, true}) {
        reco::gae_params p;
        p.gamma = gamma;
        p.lambda = lambda;
        p.whiten = whiten;
        std::vector<double> ea(R * T), er(R * T);
        for (std::size_t i = 0; i < R; ++i) gae_reference(r, v, mask, i * T, (i + 1) * T, gamma, lambda, ea, er);
        if (whiten) {
          double n = 0, sum = 0, ss = 0;
          for (std::size_t k = 0; k < ea.size(); ++k)
            if (mask[k]) n += 1, sum += ea[k];
          const double mean = sum / n;
          for (std::size_t k = 0; k < ea.size(); ++k)
            if (mask[k]) ss += (ea[k] - mean) * (ea[k] - mean);
          for (std::size_t k = 0; k < ea.size(); ++k)
            if (mask[k]) ea[k] = (ea[k] - mean) / std::sqrt(ss / (n - 1) + 1e-8);
        }
        reco::workspace<reco::cpu> ws;
        std::vector<double> a(R * T, 7.0), ret(R * T, 7.0);
        reco::gae_advantages(reco::cpu{}, reco::padded(static_cast<index_t>(R), static_cast<index_t>(T)),
                             reco::span<const double>(r), reco::span<const double>(v), reco::span<const std::uint8_t>(mask),
                             p, reco::span<double>(a), reco::span<double>(ret), ws);
        for (std::size_t k = 0; k < a.size(); ++k) {
          if (!mask[k]) {
            EXPECT_EQ(a[k], 0.0) << k;  // exactly 0, not a carried value
            EXPECT_EQ(ret[k], 0.0) << k;
            continue;
          }
          EXPECT_NEAR(a[k], ea[k], 1e-12) << k << " gamma " << gamma << " lambda " << lambda << " whiten " << whiten;
          EXPECT_NEAR(ret[k], er[k], 1e-12) << k;
        }

        // Packed: responses back to back, each keeping its own (masked) tail, float values.
        std::vector<index_t> offsets = {0};
        std::vector<float> pr, pv;
        std::vector<std::uint8_t> pm;
        std::vector<double> pea, per;
        for (std::size_t i = 0; i < R; ++i) {
          const std::size_t keep = i == 2 ? T : lengths[i] + (i % 2);  // some trailing masked tokens
          for (std::size_t t = 0; t < keep; ++t) {
            pr.push_back(static_cast<float>(r[i * T + t]));
            pv.push_back(static_cast<float>(v[i * T + t]));
            pm.push_back(mask[i * T + t]);
            pea.push_back(ea[i * T + t]);
            per.push_back(er[i * T + t]);
          }
          offsets.push_back(static_cast<index_t>(pr.size()));
        }
        std::vector<float> pa(pr.size(), 7.0f), pret(pr.size(), 7.0f);
        reco::gae_advantages(reco::cpu{}, reco::packed(reco::span<const index_t>(offsets)), reco::span<const float>(pr),
                             reco::span<const float>(pv), reco::span<const std::uint8_t>(pm), p, reco::span<float>(pa),
                             reco::span<float>(pret), ws);
        for (std::size_t k = 0; k < pa.size(); ++k) {
          if (!pm[k]) {
            EXPECT_EQ(pa[k], 0.0f);
            EXPECT_EQ(pret[k], 0.0f);
            continue;
          }
          EXPECT_NEAR(pa[k], pea[k], 1e-5 * (1 + std::abs(pea[k])));
          EXPECT_NEAR(pret[k], per[k], 1e-5 * (1 + std::abs(per[k])));
        }
      }
    }
  }
}

TEST(BatchOps, GaeOutcomeRewardsAndLambdaOne) {
  // Outcome rewards on the last valid token; with lambda = 1 the return is the discounted sum of
  // the rewards to go, gamma^(valid tokens after t) * s, whatever the values.
  const index_t R = 3, T = 4;
  std::vector<std::uint8_t> mask = {1, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1};
  std::vector<double> s = {2.0, -1.0, 0.5}, tr(12, 9.0), v = {0.3, -0.2, 0.7, 5, 0.1, 5, 0.4, 5, -0.6, 0.2, 0.0, 0.9};
  reco::outcome_token_rewards(reco::cpu{}, reco::padded(R, T), reco::span<const double>(s),
                              reco::span<const std::uint8_t>(mask), reco::span<double>(tr));
  EXPECT_EQ(tr, (std::vector<double>{0, 0, 2, 0, 0, 0, -1, 0, 0, 0, 0, 0.5}));
  reco::workspace<reco::cpu> ws;
  reco::gae_params p;
  p.gamma = 0.8;
  p.whiten = false;
  std::vector<double> a(12), ret(12);
  reco::gae_advantages(reco::cpu{}, reco::padded(R, T), reco::span<const double>(tr), reco::span<const double>(v),
                       reco::span<const std::uint8_t>(mask), p, reco::span<double>(a), reco::span<double>(ret), ws);
  const int after[12] = {2, 1, 0, -1, 1, -1, 0, -1, 3, 2, 1, 0};  // valid tokens after t in its response
  for (std::size_t k = 0; k < 12; ++k) {
    if (!mask[k]) continue;
    const double expect = std::pow(0.8, after[k]) * s[k / 4];
    EXPECT_NEAR(ret[k], expect, 1e-14) << k;
    EXPECT_NEAR(a[k], expect - v[k], 1e-14) << k;
  }
}

TEST(BatchOps, GaeErrorsNameTheArgument) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto call = [&](reco::gae_params p, std::vector<double> r, std::vector<double> v, std::vector<std::uint8_t> m,
                  std::size_t n_adv, std::size_t n_ret) {
    std::vector<double> a(n_adv), ret(n_ret);
    reco::workspace<reco::cpu> ws;
    return named_argument([&] {
      reco::gae_advantages(reco::cpu{}, reco::padded(2, 2), reco::span<const double>(r), reco::span<const double>(v),
                           reco::span<const std::uint8_t>(m), p, reco::span<double>(a), reco::span<double>(ret), ws);
    });
  };
  const std::vector<double> r = {0, 1, 0, 2}, v = {0.5, 0.5, 0.1, 0.1};
  const std::vector<std::uint8_t> m = {1, 1, 1, 0};
  reco::gae_params ok;
  EXPECT_EQ(call(ok, r, v, m, 4, 4), "");
  for (const double bad : {-0.1, 1.5, nan}) {
    reco::gae_params p;
    p.gamma = bad;
    EXPECT_EQ(call(p, r, v, m, 4, 4), "params.gamma");
    p = reco::gae_params{};
    p.lambda = bad;
    EXPECT_EQ(call(p, r, v, m, 4, 4), "params.lambda");
  }
  reco::gae_params eps;
  eps.whiten_eps = -1;
  EXPECT_EQ(call(eps, r, v, m, 4, 4), "params.whiten_eps");
  EXPECT_EQ(call(ok, {0, nan, 0, 2}, v, m, 4, 4), "token_rewards");
  EXPECT_EQ(call(ok, r, {0.5, 0.5, nan, 0.1}, m, 4, 4), "values");
  EXPECT_EQ(call(ok, {0, 1, 0, nan}, {0.5, 0.5, 0.1, nan}, m, 4, 4), "");  // masked: not read
  EXPECT_EQ(call(ok, {0, 1, 0}, v, m, 4, 4), "token_rewards");
  EXPECT_EQ(call(ok, r, {0.5, 0.5, 0.1}, m, 4, 4), "values");
  EXPECT_EQ(call(ok, r, v, {1, 1, 1}, 4, 4), "mask");
  EXPECT_EQ(call(ok, r, v, m, 3, 4), "advantages");
  EXPECT_EQ(call(ok, r, v, m, 4, 5), "returns");
  EXPECT_EQ(call(ok, r, v, {0, 0, 1, 0}, 4, 4), "mask");  // whitening one valid token
  reco::gae_params raw;
  raw.whiten = false;
  EXPECT_EQ(call(raw, r, v, {0, 0, 1, 0}, 4, 4), "");
  EXPECT_EQ(call(raw, r, v, {0, 0, 0, 0}, 4, 4), "");
  std::vector<double> tr(4);
  EXPECT_EQ(named_argument([&] {
              reco::outcome_token_rewards(reco::cpu{}, reco::padded(2, 2), reco::span<const double>(r),
                                          reco::span<const std::uint8_t>(m), reco::span<double>(tr));
            }),
            "rewards");
}

// verl's grpo_passk on hand-made groups: only the best response gets (s_max - s_second), divided
// by the unbiased group std + eps; a tied maximum gives 0 everywhere; verl rejects a group of one
// (singleton_policy::error).
TEST(BatchOps, PassAtKVerlRule) {
  reco::pass_at_k_advantage est;
  auto run = [&](std::vector<double> s, std::uint32_t& status) {
    std::vector<double> out(s.size(), 9.0);
    reco::group_input<double> g;
    g.size = static_cast<index_t>(s.size());
    g.rewards = s.data();
    est.group(g, out.data(), status);
    return out;
  };
  std::uint32_t status = 0;
  const std::vector<double> s = {0.2, 1.0, 0.5, 0.0};
  double mean = 0, ss = 0;
  for (double x : s) mean += x / 4;
  for (double x : s) ss += (x - mean) * (x - mean);
  const double sd = std::sqrt(ss / 3);
  auto a = run(s, status);
  EXPECT_EQ(a[0], 0.0);
  EXPECT_NEAR(a[1], (1.0 - 0.5) / (sd + 1e-6), 1e-14);
  EXPECT_EQ(a[2], 0.0);
  EXPECT_EQ(a[3], 0.0);
  EXPECT_EQ(run({0.2, 1.0, 0.5, 1.0}, status), (std::vector<double>{0, 0, 0, 0}));  // tie at the top
  est.params.scale_by_std = false;
  EXPECT_EQ(run({-1.0, -3.0, -0.25}, status), (std::vector<double>{0, 0, 0.75}));
  EXPECT_EQ(status, 0u);
  est.params.singleton = reco::singleton_policy::error;
  EXPECT_EQ(run({0.7}, status), (std::vector<double>{0}));
  EXPECT_NE(status & reco::singleton_group, 0u);
}

// Naive OTB on a padded [R, T] batch straight from the definition. Position = column, or with
// valid_positions the index among the response's valid tokens (responses without one leave their
// group).
void otb_reference(std::size_t T, const std::vector<index_t>& groups, const std::vector<double>& r,
                   const std::vector<double>& lp, const std::vector<double>& spq, const std::vector<double>& isw,
                   const std::vector<std::uint8_t>& m, double eps, bool zero_tail, bool valid_positions,
                   std::vector<double>& adv, std::vector<double>& ret) {
  const std::size_t R = m.size() / T;
  std::vector<double> G(R * T, 0), W(R * T, 0);
  std::vector<index_t> len(R, 0);
  std::vector<std::size_t> pos(R * T, 0);  // each token's position
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t p = 0; p < T; ++p) {
      for (std::size_t q = p; q < T; ++q)
        if (m[i * T + q]) G[i * T + p] += r[i * T + q];
      for (std::size_t q = 0; q <= p; ++q)
        if (m[i * T + q])
          W[i * T + p] += (1 - 2 * std::exp(lp[i * T + q]) + spq[i * T + q]) *
                          (isw.empty() ? 1.0 : isw[i * T + q] * isw[i * T + q]);
      pos[i * T + p] = valid_positions ? static_cast<std::size_t>(len[i]) : p;
      len[i] += m[i * T + p] ? 1 : 0;
    }
  for (std::size_t g = 0; g + 1 < groups.size(); ++g) {
    const auto a = static_cast<std::size_t>(groups[g]), b = static_cast<std::size_t>(groups[g + 1]);
    std::vector<std::size_t> members;
    for (std::size_t i = a; i < b; ++i)
      if (!valid_positions || len[i] > 0) members.push_back(i);
    std::vector<index_t> sorted;
    for (std::size_t i : members) sorted.push_back(len[i]);
    std::sort(sorted.begin(), sorted.end());
    std::size_t tail_row = R;  // the unique longest member, if any
    if (members.size() > 1 && sorted[sorted.size() - 1] > sorted[sorted.size() - 2])
      for (std::size_t i : members)
        if (len[i] == sorted.back()) tail_row = i;
    for (std::size_t i = a; i < b; ++i)
      for (std::size_t q = 0; q < T; ++q) {
        const std::size_t k = i * T + q;
        adv[k] = ret[k] = 0;
        if (!m[k]) continue;
        double num = 0, den = 0;  // over the members' valid tokens at the same position
        for (std::size_t h : members)
          for (std::size_t q2 = 0; q2 < T; ++q2)
            if (m[h * T + q2] && pos[h * T + q2] == pos[k]) num += G[h * T + q2] * W[h * T + q2], den += W[h * T + q2];
        double base = members.size() == 1 ? 0.0 : num / (den + eps);
        if (zero_tail && i == tail_row && pos[k] >= static_cast<std::size_t>(sorted[sorted.size() - 2])) base = 0;
        adv[k] = G[k] - base;
        ret[k] = G[k];
      }
  }
}

TEST(BatchOps, OptimalTokenBaselineHandComputed) {
  // Two responses of 2 tokens, pi = 0.5 and sum pi^2 = 0.5 everywhere: w = 0.5, W = {0.5, 1}.
  // Rewards to go {1, 1} and {0, 0}: B = 0.5 at both positions, A = +-0.5.
  const std::vector<index_t> groups = {0, 2};
  std::vector<double> r = {0, 1, 0, 0}, lp(4, std::log(0.5)), spq(4, 0.5), a(4), ret(4);
  reco::optimal_token_baseline_params p;
  p.eps = 0;
  reco::workspace<reco::cpu> ws;
  reco::optimal_token_baseline_advantages(reco::cpu{}, reco::padded(2, 2), reco::span<const index_t>(groups),
                                          reco::span<const double>(r), reco::span<const double>(lp),
                                          reco::span<const double>(spq), reco::span<const double>(),
                                          reco::span<const std::uint8_t>(), p, reco::span<double>(a),
                                          reco::span<double>(ret), ws);
  for (std::size_t k = 0; k < 4; ++k) EXPECT_NEAR(a[k], k < 2 ? 0.5 : -0.5, 1e-15) << k;
  EXPECT_EQ(ret, (std::vector<double>{1, 1, 0, 0}));
}

TEST(BatchOps, OptimalTokenBaselineRagged) {
  const std::vector<std::size_t> lengths = {5, 3, 6, 4, 2, 6, 1};
  const std::vector<index_t> groups = {0, 3, 4, 5, 7};  // groups of one; the last with an empty response
  const std::size_t R = lengths.size(), T = 6;
  std::mt19937 rng(21);
  std::normal_distribution<double> g(0, 1);
  std::uniform_real_distribution<double> u(0.05, 0.95);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> r(R * T), lp(R * T), spq(R * T), isw(R * T);
  std::vector<std::uint8_t> m(R * T);
  for (std::size_t k = 0; k < R * T; ++k) {
    m[k] = k % T < lengths[k / T] ? 1 : 0;
    const double pi = u(rng);
    r[k] = m[k] ? g(rng) : nan;  // masked entries are never read
    lp[k] = m[k] ? std::log(pi) : nan;
    spq[k] = m[k] ? pi * pi + 0.3 * u(rng) * (1 - pi) * (1 - pi) : nan;
    isw[k] = m[k] ? u(rng) + 0.5 : nan;
  }
  m[0 * T + 2] = 0;  // interior masked tokens
  m[5 * T + 1] = 0;
  for (std::size_t k = 6 * T; k < 7 * T; ++k) m[k] = 0;  // a response without a valid token
  m[2 * T + 0] = 0;  // and a masked first token
  for (const bool valid_positions : {false, true})
  for (const bool use_is : {false, true})
    for (const bool zero_tail : {false, true}) {
      reco::optimal_token_baseline_params p;
      p.zero_tail = zero_tail;
      p.valid_positions = valid_positions;
      const std::vector<double> none;
      std::vector<double> ea(R * T), er(R * T);
      otb_reference(T, groups, r, lp, spq, use_is ? isw : none, m, p.eps, zero_tail, valid_positions, ea, er);
      reco::workspace<reco::cpu> ws;
      std::vector<double> a(R * T, 7), ret(R * T, 7);
      reco::optimal_token_baseline_advantages(
          reco::cpu{}, reco::padded(static_cast<index_t>(R), static_cast<index_t>(T)), reco::span<const index_t>(groups),
          reco::span<const double>(r), reco::span<const double>(lp), reco::span<const double>(spq),
          use_is ? reco::span<const double>(isw) : reco::span<const double>(), reco::span<const std::uint8_t>(m), p,
          reco::span<double>(a), reco::span<double>(ret), ws);
      for (std::size_t k = 0; k < a.size(); ++k) {
        if (!m[k]) {
          EXPECT_EQ(a[k], 0.0);
          EXPECT_EQ(ret[k], 0.0);
          continue;
        }
        EXPECT_NEAR(a[k], ea[k], 1e-12) << k << " is " << use_is << " tail " << zero_tail << " valid_positions "
                                        << valid_positions;
        EXPECT_NEAR(ret[k], er[k], 1e-12) << k;
      }
      // Packed, each response keeping its padded row (positions unchanged) but the last, cut short.
      std::vector<index_t> offsets = {0};
      std::vector<double> pr, plp, pspq, pisw, pea;
      std::vector<std::uint8_t> pm;
      for (std::size_t i = 0; i < R; ++i) {
        const std::size_t keep = i + 1 == R ? lengths[i] : T;
        for (std::size_t t = 0; t < keep; ++t) {
          const std::size_t k = i * T + t;
          pr.push_back(r[k]), plp.push_back(lp[k]), pspq.push_back(spq[k]), pisw.push_back(isw[k]);
          pm.push_back(m[k]), pea.push_back(ea[k]);
        }
        offsets.push_back(static_cast<index_t>(pr.size()));
      }
      std::vector<double> pa(pr.size()), pret(pr.size());
      reco::optimal_token_baseline_advantages(
          reco::cpu{}, reco::packed(reco::span<const index_t>(offsets)), reco::span<const index_t>(groups),
          reco::span<const double>(pr), reco::span<const double>(plp), reco::span<const double>(pspq),
          use_is ? reco::span<const double>(pisw) : reco::span<const double>(), reco::span<const std::uint8_t>(pm), p,
          reco::span<double>(pa), reco::span<double>(pret), ws);
      for (std::size_t k = 0; k < pa.size(); ++k) EXPECT_NEAR(pa[k], pm[k] ? pea[k] : 0.0, 1e-12) << k;
    }
}

TEST(BatchOps, OptimalTokenBaselineErrors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> r = {0, 1, 0, 2}, lp = {-0.5, -0.7, -0.1, -2}, spq = {0.5, 0.4, 0.9, 0.2};
  const std::vector<std::uint8_t> m = {1, 1, 1, 0};
  auto call = [&](std::vector<index_t> groups, std::vector<double> rr, std::vector<double> ll, std::vector<double> is,
                  std::vector<std::uint8_t> mm, double eps, std::size_t n_out) {
    std::vector<double> a(n_out), ret(4);
    reco::optimal_token_baseline_params p;
    p.eps = eps;
    reco::workspace<reco::cpu> ws;
    return named_argument([&] {
      reco::optimal_token_baseline_advantages(reco::cpu{}, reco::padded(2, 2), reco::span<const index_t>(groups),
                                              reco::span<const double>(rr), reco::span<const double>(ll),
                                              reco::span<const double>(spq), reco::span<const double>(is),
                                              reco::span<const std::uint8_t>(mm), p, reco::span<double>(a),
                                              reco::span<double>(ret), ws);
    });
  };
  EXPECT_EQ(call({0, 1, 2}, r, lp, {}, m, 1e-8, 4), "");
  EXPECT_EQ(call({0, 0, 2}, r, lp, {}, m, 1e-8, 4), "group_offsets");  // empty group
  EXPECT_EQ(call({0, 2, 2}, r, lp, {}, m, 1e-8, 4), "group_offsets");
  EXPECT_EQ(call({0, 1}, r, lp, {}, m, 1e-8, 4), "group_offsets");
  EXPECT_EQ(call({1, 2}, r, lp, {}, m, 1e-8, 4), "group_offsets");
  EXPECT_EQ(call({0}, r, lp, {}, m, 1e-8, 4), "group_offsets");
  EXPECT_EQ(call({}, r, lp, {}, m, 1e-8, 4), "group_offsets");
  EXPECT_EQ(call({0, 2}, {0, nan, 0, 0}, lp, {}, m, 1e-8, 4), "token_rewards");
  EXPECT_EQ(call({0, 2}, r, {-0.5, -0.7, nan, -2}, {}, m, 1e-8, 4), "old_logp");
  EXPECT_EQ(call({0, 2}, r, {-0.5, -0.7, -0.1, nan}, {}, m, 1e-8, 4), "");  // masked: not read
  EXPECT_EQ(call({0, 2}, r, lp, {1, 1, nan, 1}, m, 1e-8, 4), "is_weights");
  EXPECT_EQ(call({0, 2}, r, lp, {1, 1}, m, 1e-8, 4), "is_weights");
  EXPECT_EQ(call({0, 2}, r, {0, 0, 0}, {}, m, 1e-8, 4), "old_logp");
  EXPECT_EQ(call({0, 2}, r, lp, {}, {1, 1}, 1e-8, 4), "mask");
  EXPECT_EQ(call({0, 2}, r, lp, {}, m, 1e-8, 3), "advantages");
  EXPECT_EQ(call({0, 2}, r, lp, {}, m, -1, 4), "params.eps");
  EXPECT_EQ(call({0, 2}, r, lp, {}, m, nan, 4), "params.eps");
}

}  // namespace
