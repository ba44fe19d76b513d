// Every component (and its options) composed into an objective, against the reference.
#include <gtest/gtest.h>

#include "core/compare.hpp"
#include "reco/reco.hpp"

namespace {

using namespace reco_test;
using reco::objective;

// A GRPO-like base that each test varies in one slot.
reco_ref::config base_config() {
  reco_ref::config c;
  c.adv = reco_ref::advantage::grpo;
  c.ratio_form = reco_ref::ratio::token;
  c.clip_mode = reco_ref::clip::ppo;
  c.weight_mode = reco_ref::weight::uniform;
  c.agg = reco_ref::aggregation::seq_mean_token_mean;
  c.kl_mode = reco_ref::kl::none;
  return c;
}

template <class Obj>
void check(const Obj& obj, const reco_ref::config& cfg, const std::string& name, std::uint64_t seed) {
  check_against_reference(obj, cfg, name, seed);
  check_finite_differences(obj, cfg, name, seed + 77);
}

template <class Adv>
using with_adv = objective<Adv, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_mean>;

TEST(Components, Advantages) {
  auto c = base_config();
  check(with_adv<reco::grpo_advantage>{}, c, "grpo", 1);
  {
    with_adv<reco::grpo_advantage> o;
    o.advantage.params.singleton = reco::singleton_policy::raw_score;
    o.advantage.params.eps = 1e-4;
    auto cc = c;
    cc.singleton_policy = reco_ref::singleton::raw_score;
    cc.adv_eps = 1e-4;
    check(o, cc, "grpo raw_score eps 1e-4", 2);
  }
  c.adv = reco_ref::advantage::dr_grpo;
  check(with_adv<reco::dr_grpo_advantage>{}, c, "dr_grpo", 3);
  c.adv = reco_ref::advantage::batch_std;
  check(with_adv<reco::batch_std_advantage>{}, c, "batch_std", 4);
  c.adv = reco_ref::advantage::rloo;
  check(with_adv<reco::rloo_advantage>{}, c, "rloo", 5);
  {
    with_adv<reco::rloo_advantage> o;
    o.advantage.params.singleton = reco::singleton_policy::raw_score;
    auto cc = c;
    cc.singleton_policy = reco_ref::singleton::raw_score;
    check(o, cc, "rloo raw_score", 6);
  }
  c.adv = reco_ref::advantage::reinforce_pp;
  check(with_adv<reco::reinforce_pp_advantage>{}, c, "reinforce_pp", 7);
  {
    with_adv<reco::reinforce_pp_advantage> o;
    o.advantage.params.unbiased_variance = false;
    auto cc = c;
    cc.whiten_unbiased = false;
    check(o, cc, "reinforce_pp biased", 8);
  }
  c.adv = reco_ref::advantage::opo;
  check(with_adv<reco::opo_advantage>{}, c, "opo", 9);
  c.adv = reco_ref::advantage::pass_at_k;
  check(with_adv<reco::pass_at_k_advantage>{}, c, "pass_at_k", 10);
  {
    with_adv<reco::pass_at_k_advantage> o;
    o.advantage.params.scale_by_std = false;
    auto cc = c;
    cc.scale_by_std = false;
    check(o, cc, "pass_at_k unscaled", 11);
  }
  c.adv = reco_ref::advantage::gpg;
  check(with_adv<reco::gpg_advantage>{}, c, "gpg", 12);
  c.adv = reco_ref::advantage::given;
  check(with_adv<reco::given_advantage>{}, c, "given", 13);
}

TEST(Components, Ratios) {
  auto c = base_config();
  check(objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "token", 20);
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    o.ratio.params.log_ratio_clamp = 0.25;  // the clamp bites often
    auto cc = c;
    cc.log_ratio_clamp = 0.25;
    check(o, cc, "token clamp 0.25", 21);
  }
  c.ratio_form = reco_ref::ratio::sequence;
  check(objective<reco::grpo_advantage, reco::sequence_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "sequence", 22);
  c.ratio_form = reco_ref::ratio::variance;
  check(objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "variance", 23);
  c.ratio_form = reco_ref::ratio::flipped;
  check(objective<reco::grpo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "flipped", 24);
  {
    objective<reco::grpo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    o.ratio.params.flip_all = true;
    auto cc = c;
    cc.ratio_form = reco_ref::ratio::flipped_all;
    check(o, cc, "flipped_all", 25);
  }
  c.clip_mode = reco_ref::clip::none;
  c.ratio_form = reco_ref::ratio::reinforce;
  check(objective<reco::grpo_advantage, reco::reinforce_ratio, reco::no_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "reinforce", 26);
  c.ratio_form = reco_ref::ratio::cispo;
  check(objective<reco::grpo_advantage, reco::cispo_ratio, reco::no_clip, reco::uniform_weight, reco::token_mean>{},
        [&] {
          auto cc = c;
          cc.agg = reco_ref::aggregation::token_mean;
          return cc;
        }(),
        "cispo", 27);
  {
    objective<reco::grpo_advantage, reco::cispo_ratio, reco::no_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    o.ratio.params.eps_low = 0.1;
    o.ratio.params.eps_high = 0.15;
    auto cc = c;
    cc.cispo_eps_low = 0.1;
    cc.cispo_eps_high = 0.15;
    check(o, cc, "cispo tight", 28);
  }
  c.ratio_form = reco_ref::ratio::sapo;
  check(objective<reco::grpo_advantage, reco::sapo_ratio, reco::no_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "sapo", 29);
  c.ratio_form = reco_ref::ratio::gmpo;
  check(objective<reco::grpo_advantage, reco::gmpo_ratio, reco::no_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean>{},
        c, "gmpo", 30);
  {
    objective<reco::grpo_advantage, reco::gmpo_ratio, reco::no_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    o.ratio.params.eps_low = 0.1;
    o.ratio.params.eps_high = 0.05;
    auto cc = c;
    cc.gmpo_eps_low = 0.1;
    cc.gmpo_eps_high = 0.05;
    check(o, cc, "gmpo tight", 31);
  }
}

TEST(Components, Clips) {
  auto c = base_config();
  using ppo = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                        reco::seq_mean_token_mean>;
  {
    ppo o;
    o.clip.params.eps_low = 0.1;
    o.clip.params.eps_high = 0.28;
    auto cc = c;
    cc.eps_low = 0.1;
    cc.eps_high = 0.28;
    check(o, cc, "ppo 0.1/0.28", 40);
  }
  {
    ppo o;
    o.clip.params.dual_clip = reco::dual_clip_mode::hard;
    o.clip.params.dual_clip_c = 1.3;  // low enough to fire on these batches
    auto cc = c;
    cc.dual_mode = reco_ref::dual::hard;
    cc.dual_c = 1.3;
    check(o, cc, "hard dual 1.3", 41);
  }
  {
    ppo o;
    o.clip.params.dual_clip = reco::dual_clip_mode::soft;
    o.clip.params.dual_clip_c = 1.3;
    auto cc = c;
    cc.dual_mode = reco_ref::dual::soft;
    cc.dual_c = 1.3;
    check(o, cc, "soft dual 1.3", 42);
  }
  {
    objective<reco::grpo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    o.clip.params.dual_clip = reco::dual_clip_mode::soft;
    o.clip.params.dual_clip_c = 1.5;
    auto cc = c;
    cc.ratio_form = reco_ref::ratio::flipped;
    cc.dual_mode = reco_ref::dual::soft;
    cc.dual_c = 1.5;
    check(o, cc, "flipped + soft dual 1.5", 43);
  }
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::entropy_split_clip, reco::uniform_weight,
              reco::seq_mean_token_mean>
        o;
    auto cc = c;
    cc.clip_mode = reco_ref::clip::entropy_split;
    check(o, cc, "entropy split", 44);
    o.clip.params.percentile = 0.5;
    o.clip.params.dual_clip = reco::dual_clip_mode::hard;
    o.clip.params.dual_clip_c = 1.4;
    cc.split_percentile = 0.5;
    cc.dual_mode = reco_ref::dual::hard;
    cc.dual_c = 1.4;
    check(o, cc, "entropy split 0.5 + hard dual", 45);
  }
  {
    objective<reco::grpo_advantage, reco::variance_ratio, reco::no_clip, reco::uniform_weight, reco::seq_mean_token_mean> o;
    auto cc = c;
    cc.clip_mode = reco_ref::clip::none;
    cc.ratio_form = reco_ref::ratio::variance;
    check(o, cc, "variance unclipped", 46);
  }
}

TEST(Components, Weights) {
  auto c = base_config();
  using ec = objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::expected_count_weight,
                       reco::seq_mean_token_mean>;
  c.ratio_form = reco_ref::ratio::variance;
  c.weight_mode = reco_ref::weight::expected_count;
  check(ec{}, c, "expected_count", 50);
  for (auto norm : {reco::weight_normalisation::group_mean, reco::weight_normalisation::batch_mean}) {
    ec o;
    o.weight.params.normalise = norm;
    o.weight.params.cap = 2.0;  // a low cap so that it fires
    auto cc = c;
    cc.weight_normalisation =
        norm == reco::weight_normalisation::group_mean ? reco_ref::weight_norm::group_mean : reco_ref::weight_norm::batch_mean;
    cc.weight_cap = 2.0;
    check(o, cc, "expected_count normalised", 51);
  }
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight, reco::seq_mean_token_mean> o;
    o.weight.params.cap = 1.5;
    o.weight.params.normalise = reco::weight_normalisation::batch_mean;
    auto cc = base_config();
    cc.weight_mode = reco_ref::weight::caller;
    cc.weight_cap = 1.5;
    cc.weight_normalisation = reco_ref::weight_norm::batch_mean;
    check(o, cc, "caller weights", 52);
  }
}

TEST(Components, Selection) {
  using sel = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                        reco::top_entropy_selection>;
  using sel_seq = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                            reco::seq_mean_token_mean, reco::top_entropy_selection>;
  for (auto rule : {reco::selection_rule::top_k, reco::selection_rule::quantile}) {
    for (auto denom : {reco::selection_denominator::valid, reco::selection_denominator::kept}) {
      auto cc = base_config();
      cc.select = rule == reco::selection_rule::top_k ? reco_ref::selection::top_k : reco_ref::selection::quantile;
      cc.denom = denom == reco::selection_denominator::valid ? reco_ref::denominator::valid : reco_ref::denominator::kept;
      cc.rho = 0.3;
      cc.agg = reco_ref::aggregation::token_mean;
      sel o;
      o.select.params.rule = rule;
      o.select.params.denominator = denom;
      o.select.params.rho = 0.3;
      check(o, cc, "selection token_mean", 60);
      cc.agg = reco_ref::aggregation::seq_mean_token_mean;
      sel_seq s;
      s.select.params = o.select.params;
      check(s, cc, "selection seq_mean_token_mean", 61);
    }
  }
  {
    sel o;
    o.select.params.use_given = true;
    o.select.params.given = reco::entropy_cut{1.5, -1};
    auto cc = base_config();
    cc.agg = reco_ref::aggregation::token_mean;
    cc.select = reco_ref::selection::top_k;
    cc.use_given_cut = true;
    cc.given_cut = 1.5;
    cc.given_ties = -1;
    check(o, cc, "given cut", 62);
  }
}

TEST(Components, Aggregations) {
  auto c = base_config();
  c.kl_mode = reco_ref::kl::k3;
  c.agg = reco_ref::aggregation::token_mean;
  check(objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::kl_penalty>{},
        c, "token_mean", 70);
  c.agg = reco_ref::aggregation::seq_mean_token_sum;
  check(objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_sum, reco::kl_penalty>{},
        c, "seq_mean_token_sum", 71);
  c.agg = reco_ref::aggregation::seq_mean_token_sum_norm;
  check(objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_sum_norm, reco::kl_penalty>{},
        c, "seq_mean_token_sum_norm", 72);
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_sum_norm,
              reco::kl_penalty>
        o;
    o.aggregate.params.constant = 37.5;
    auto cc = c;
    cc.sum_norm_constant = 37.5;
    check(o, cc, "seq_mean_token_sum_norm constant", 73);
  }
}

TEST(Components, KlAndEntropy) {
  using obj_t = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                          reco::seq_mean_token_mean, reco::kl_penalty>;
  const std::pair<reco::kl_estimator, reco_ref::kl> kinds[] = {{reco::kl_estimator::k1, reco_ref::kl::k1},
                                                               {reco::kl_estimator::abs, reco_ref::kl::abs},
                                                               {reco::kl_estimator::k2, reco_ref::kl::k2},
                                                               {reco::kl_estimator::k3, reco_ref::kl::k3}};
  std::uint64_t seed = 80;
  for (auto [lib_kind, ref_kind] : kinds) {
    for (bool clamp : {true, false}) {
      for (bool st : {false, true}) {
        obj_t o;
        o.kl.params.estimator = lib_kind;
        o.kl.params.clamp = clamp;
        o.kl.params.straight_through = st;
        o.kl.params.beta = 0.1;
        auto cc = base_config();
        cc.kl_mode = ref_kind;
        cc.kl_clamp = clamp;
        cc.kl_straight_through = st;
        cc.kl_beta = 0.1;
        check_against_reference(o, cc, "kl", seed++);
      }
    }
  }
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
              reco::kl_penalty, reco::entropy_bonus>
        o;
    o.entropy.params.coef = 0.01;
    auto cc = base_config();
    cc.kl_mode = reco_ref::kl::k3;
    cc.agg = reco_ref::aggregation::token_mean;
    cc.entropy_bonus = true;
    cc.entropy_coef = 0.01;
    check(o, cc, "entropy bonus", 90);
  }
}

// The peers' switches and loss types (docs/peers.md).

// TRL's delta: the unclipped ratio capped at delta for both advantage signs; above and below
// 1 + eps_high, with the hard dual clip, with clip-higher and token_mean.
TEST(Components, PeerDelta) {
  using obj_t = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                          reco::seq_mean_token_mean>;
  std::uint64_t seed = 300;
  for (double delta : {1.3, 1.1, 0.9}) {
    obj_t o;
    o.clip.params.delta = delta;
    auto cc = base_config();
    cc.delta = delta;
    check(o, cc, "delta " + std::to_string(delta), seed++);
  }
  {
    obj_t o;
    o.clip.params.delta = 1.5;
    o.clip.params.dual_clip = reco::dual_clip_mode::hard;
    o.clip.params.dual_clip_c = 1.3;
    auto cc = base_config();
    cc.delta = 1.5;
    cc.dual_mode = reco_ref::dual::hard;
    cc.dual_c = 1.3;
    check(o, cc, "delta + hard dual", seed++);
  }
  {
    objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
              reco::kl_penalty>
        o;
    o.clip.params.eps_high = 0.28;
    o.clip.params.delta = 1.4;
    o.ratio.params.log_ratio_clamp = 0;  // TRL has no clamp
    auto cc = base_config();
    cc.eps_high = 0.28;
    cc.delta = 1.4;
    cc.log_ratio_clamp = 0;
    cc.agg = reco_ref::aggregation::token_mean;
    cc.kl_mode = reco_ref::kl::k3;
    check(o, cc, "delta clip-higher token_mean", seed++);
  }
  // With delta >= 1 + eps_high, the delta cap is verl's hard dual clip at c = delta.
  // Below 1 + eps_high it also caps A > 0 tokens, so the loss moves away from plain PPO's.
  obj_t a, b, low, plain;
  a.clip.params.delta = 1.25;
  b.clip.params.dual_clip = reco::dual_clip_mode::hard;
  b.clip.params.dual_clip_c = 1.25;
  low.clip.params.delta = 1.05;
  const auto specs = standard_specs();
  double fired = 0, moved = 0;
  for (std::size_t k = 0; k < 8; ++k) {
    const master_batch m = make_batch(320 + k, specs[k]);
    const library_output la = run_library<double>(a, m), lb = run_library<double>(b, m);
    EXPECT_EQ(la.result.loss, lb.result.loss) << k;
    EXPECT_EQ(la.result.stats.dual_clip_frac, lb.result.stats.dual_clip_frac) << k;
    EXPECT_EQ(la.grad_logp, lb.grad_logp) << k;
    fired += la.result.stats.dual_clip_frac;
    moved += std::fabs(run_library<double>(low, m).result.loss - run_library<double>(plain, m).result.loss);
  }
  EXPECT_GT(fired, 0.0) << "the cap never fired";
  EXPECT_GT(moved, 0.0) << "delta below 1 + eps_high never changed the loss";
}

// VESPO (TRL): the detached gamma weight of the response's product of token ratios.
TEST(Components, PeerVespo) {
  auto c = base_config();
  c.ratio_form = reco_ref::ratio::vespo;
  c.clip_mode = reco_ref::clip::none;
  c.agg = reco_ref::aggregation::token_mean;
  check(objective<reco::grpo_advantage, reco::vespo_ratio, reco::no_clip, reco::uniform_weight, reco::token_mean>{},
        c, "vespo", 330);
  {
    objective<reco::grpo_advantage, reco::vespo_ratio, reco::no_clip, reco::uniform_weight, reco::seq_mean_token_mean,
              reco::kl_penalty>
        o;
    o.ratio.params = {0.5, 1.5, 4.0, 0.25};
    auto cc = c;
    cc.agg = reco_ref::aggregation::seq_mean_token_mean;
    cc.kl_mode = reco_ref::kl::k3;
    cc.vespo_k_pos = 0.5;
    cc.vespo_lambda_pos = 1.5;
    cc.vespo_k_neg = 4.0;
    cc.vespo_lambda_neg = 0.25;
    check(o, cc, "vespo params + kl", 331);
  }
}

// LUSPO (TRL): token sums averaged over every response, with the token and the sequence ratio.
TEST(Components, PeerLuspo) {
  auto c = base_config();
  c.kl_mode = reco_ref::kl::k3;
  c.agg = reco_ref::aggregation::seq_mean_token_sum_all;
  check(objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_sum_all, reco::kl_penalty>{},
        c, "seq_mean_token_sum_all", 340);
  {
    objective<reco::grpo_advantage, reco::sequence_ratio, reco::ppo_clip, reco::uniform_weight,
              reco::seq_mean_token_sum_all>
        o;
    o.clip.params.eps_low = 3e-4;
    o.clip.params.eps_high = 4e-4;
    auto cc = base_config();
    cc.ratio_form = reco_ref::ratio::sequence;
    cc.eps_low = 3e-4;
    cc.eps_high = 4e-4;
    cc.agg = reco_ref::aggregation::seq_mean_token_sum_all;
    check(o, cc, "luspo sequence", 341);
  }
}

// TRL's use_bias_correction_kl: the KL estimate times the (not detached) token ratio.
TEST(Components, PeerImportanceWeightedKl) {
  using obj_t = objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                          reco::seq_mean_token_mean, reco::kl_penalty>;
  std::uint64_t seed = 350;
  const std::pair<reco::kl_estimator, reco_ref::kl> kinds[] = {{reco::kl_estimator::k1, reco_ref::kl::k1},
                                                               {reco::kl_estimator::k2, reco_ref::kl::k2},
                                                               {reco::kl_estimator::k3, reco_ref::kl::k3}};
  for (auto [lib_kind, ref_kind] : kinds) {
    for (bool clamp : {true, false}) {
      for (bool st : {false, true}) {
        obj_t o;
        o.kl.params.estimator = lib_kind;
        o.kl.params.clamp = clamp;
        o.kl.params.straight_through = st;
        o.kl.params.importance_weighted = true;
        o.kl.params.beta = 0.1;
        auto cc = base_config();
        cc.kl_mode = ref_kind;
        cc.kl_clamp = clamp;
        cc.kl_straight_through = st;
        cc.kl_importance_weighted = true;
        cc.kl_beta = 0.1;
        check(o, cc, "importance-weighted kl", seed++);
      }
    }
  }
}

TEST(Components, TokenWeights) {
  // Rollout importance weights multiply the policy term.
  reco::presets::reco o;
  auto cc = reco_ref::preset("reco");
  const auto specs = standard_specs();
  for (std::size_t k = 0; k < 6; ++k) {
    batch_spec s = specs[k];
    s.token_weights = true;
    master_batch m = make_batch(900 + k, s);
    const reco_ref::output ref = reco_ref::evaluate(to_reference(m), cc);
    for (bool vectorise : {true, false})
      expect_matches(run_library<double>(o, m, {}, vectorise), ref, tolerances_for<double>(),
                     "token weights " + std::to_string(k) + path_name(vectorise));
  }
}

}  // namespace
