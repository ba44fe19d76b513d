// Batch helpers: group filters with compaction, overlong shaping, truncation masking, prompt
// grouping, KL in the reward, and the population cut of the 80/20 rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/random_batch.hpp"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/batch_ops/kl_reward.hpp"
#include "reco/batch_ops/overlong_penalty.hpp"
#include "reco/batch_ops/prompt_groups.hpp"
#include "reco/batch_ops/truncation_mask.hpp"
#include "reco/reco.hpp"
#include "reco/select/entropy_threshold.hpp"

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

}  // namespace
