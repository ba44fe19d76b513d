// Self-consistency of the reference: for every preset and for each component on its own, the
// analytic gradient agrees with central finite differences of frozen_loss (docs/concepts.md), invalid
// tokens get exactly zero gradient and are never read, and the regimes the checks are meant to
// cover (clipping, dual clipping, clamps) actually occur.

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reference/ref_test_util.hpp"

namespace {

using namespace reco_ref;
using reco_ref_test::check_gradients;
using reco_ref_test::fd_report;
using reco_ref_test::random_batch;
using reco_ref_test::shape_for_seed;

struct named_config {
  std::string name;
  config cfg;
};
void PrintTo(const named_config& c, std::ostream* os) { *os << c.name; }

std::vector<named_config> gradient_configs() {
  std::vector<named_config> out;
  auto add = [&](const std::string& name, const config& c) { out.push_back({name, c}); };

  for (const std::string& p : preset_names()) add("preset_" + p, preset(p));

  // Every advantage estimator, both singleton policies (the advantage is a constant of the loss;
  // this covers each estimator's output feeding the loss).
  const std::pair<const char*, advantage> advs[] = {
      {"grpo", advantage::grpo},       {"dr_grpo", advantage::dr_grpo}, {"batch_std", advantage::batch_std},
      {"rloo", advantage::rloo},       {"reinforce_pp", advantage::reinforce_pp}, {"opo", advantage::opo},
      {"pass_at_k", advantage::pass_at_k}, {"gpg", advantage::gpg},    {"given", advantage::given}};
  for (const auto& a : advs) {
    for (int raw = 0; raw < 2; ++raw) {
      config c = preset("grpo");
      c.adv = a.second;
      c.singleton_policy = raw ? singleton::raw_score : singleton::zero;
      add(std::string("adv_") + a.first + (raw ? "_raw" : "_zero"), c);
    }
  }
  {
    config c = preset("grpo");
    c.scale_by_std = false;
    add("adv_grpo_no_std", c);
    c.adv = advantage::pass_at_k;
    add("adv_pass_at_k_no_std", c);
    c = preset("grpo");
    c.adv = advantage::reinforce_pp;
    c.whiten_unbiased = false;
    add("adv_reinforce_pp_biased", c);
  }

  // Every ratio form.
  const std::pair<const char*, ratio> clip_forms[] = {
      {"token", ratio::token},     {"sequence", ratio::sequence}, {"variance", ratio::variance},
      {"flipped", ratio::flipped}, {"flipped_all", ratio::flipped_all}, {"gmpo", ratio::gmpo}};
  for (const auto& r : clip_forms) {
    config c = preset("grpo");
    c.ratio_form = r.second;
    add(std::string("ratio_") + r.first, c);
    c.log_ratio_clamp = 0.3;  // the clamp bites on many tokens
    add(std::string("ratio_") + r.first + "_clamp03", c);
  }
  {
    config c = preset("grpo");
    c.log_ratio_clamp = 0;
    add("ratio_token_no_clamp", c);
    c.ratio_form = ratio::variance;
    add("ratio_variance_no_clamp", c);
    c = preset("grpo");
    c.ratio_form = ratio::sequence;
    c.seq_max_log = 0.05;  // some responses above the sequence cap
    add("ratio_sequence_cap", c);
    c = preset("grpo");
    c.ratio_form = ratio::gmpo;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    add("ratio_gmpo_no_clip", c);
    c.gmpo_eps_low = 0.1;
    c.gmpo_eps_high = 0.25;
    add("ratio_gmpo_no_clip_asym", c);
  }
  const std::pair<const char*, ratio> own_forms[] = {
      {"reinforce", ratio::reinforce}, {"cispo", ratio::cispo}, {"sapo", ratio::sapo}, {"vespo", ratio::vespo}};
  for (const auto& r : own_forms) {
    config c = preset("grpo");
    c.ratio_form = r.second;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    add(std::string("ratio_") + r.first, c);
    c.log_ratio_clamp = 0.3;
    add(std::string("ratio_") + r.first + "_clamp03", c);
  }
  // The peers' switches (docs/peers.md): TRL's delta cap above and below 1 + eps_high and with a
  // dual clip, the importance-weighted KL, LUSPO's aggregation, VESPO's weight off its defaults.
  for (const auto& d : {std::make_pair("110", 1.1), std::make_pair("130", 1.3)}) {
    config c = preset("grpo");
    c.dual_mode = dual::off;
    c.delta = d.second;
    add(std::string("clip_delta_") + d.first, c);
    c.dual_mode = dual::hard;
    c.dual_c = 1.2;
    add(std::string("clip_delta_dual_") + d.first, c);
  }
  for (kl k : {kl::k1, kl::k2, kl::k3}) {
    config c = preset("grpo");
    c.kl_mode = k;
    c.kl_beta = 0.1;
    c.kl_importance_weighted = true;
    add("kl_importance_weighted_" + std::to_string(static_cast<int>(k)), c);
    c.kl_straight_through = true;
    add("kl_importance_weighted_st_" + std::to_string(static_cast<int>(k)), c);
  }
  {
    config c = preset("grpo");
    c.agg = aggregation::seq_mean_token_sum_all;
    add("agg_seq_mean_token_sum_all", c);
    c.ratio_form = ratio::sequence;
    add("agg_seq_mean_token_sum_all_sequence", c);
    c = preset("grpo");
    c.ratio_form = ratio::vespo;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.vespo_k_pos = 0.5;
    c.vespo_lambda_pos = 1.5;
    c.vespo_k_neg = 4;
    c.vespo_lambda_neg = 0.25;
    add("ratio_vespo_params", c);
  }
  {
    config c = preset("cispo");
    c.cispo_eps_low = 0.2;
    c.cispo_eps_high = 0.3;  // many tokens outside the CISPO range
    add("ratio_cispo_narrow", c);
  }

  // Every clip x dual mode, on the ratio forms the clip applies to.
  const std::pair<const char*, ratio> clip_ratios[] = {
      {"token", ratio::token}, {"variance", ratio::variance}, {"flipped", ratio::flipped},
      {"flipped_all", ratio::flipped_all}};
  const std::pair<const char*, clip> clips[] = {
      {"none", clip::none}, {"ppo", clip::ppo}, {"split", clip::entropy_split}};
  const std::pair<const char*, dual> duals[] = {{"off", dual::off}, {"hard", dual::hard}, {"soft", dual::soft}};
  for (const auto& r : clip_ratios) {
    for (const auto& cl : clips) {
      for (const auto& d : duals) {
        config c;
        c.ratio_form = r.second;
        c.clip_mode = cl.second;
        c.dual_mode = d.second;
        c.dual_c = 2;
        c.eps_low = 0.1;
        c.eps_high = 0.3;
        add(std::string("clip_") + r.first + "_" + cl.first + "_" + d.first, c);
      }
    }
  }

  // Response weights and normalisation.
  const std::pair<const char*, weight_norm> norms[] = {
      {"none", weight_norm::none}, {"group", weight_norm::group_mean}, {"batch", weight_norm::batch_mean}};
  for (const auto& n : norms) {
    for (double cap : {10.0, 0.0, 1.5}) {
      config c = preset("reco");
      c.weight_normalisation = n.second;
      c.weight_cap = cap;
      add(std::string("weight_expected_") + n.first + "_cap" + std::to_string(static_cast<int>(cap * 10)), c);
      c.weight_mode = weight::caller;
      add(std::string("weight_caller_") + n.first + "_cap" + std::to_string(static_cast<int>(cap * 10)), c);
    }
  }

  // Selection rule x denominator x aggregation, and a caller's cut.
  const std::pair<const char*, selection> sels[] = {{"top_k", selection::top_k}, {"quantile", selection::quantile}};
  const std::pair<const char*, denominator> dens[] = {{"valid", denominator::valid}, {"kept", denominator::kept}};
  const std::pair<const char*, aggregation> aggs[] = {
      {"token_mean", aggregation::token_mean},
      {"seq_mean_token_mean", aggregation::seq_mean_token_mean},
      {"seq_mean_token_sum", aggregation::seq_mean_token_sum},
      {"seq_mean_token_sum_norm", aggregation::seq_mean_token_sum_norm}};
  for (const auto& s : sels) {
    for (const auto& d : dens) {
      for (const auto& a : aggs) {
        config c = preset("rule_80_20_reco");
        c.select = s.second;
        c.denom = d.second;
        c.agg = a.second;
        c.rho = 0.3;
        add(std::string("select_") + s.first + "_" + d.first + "_" + a.first, c);
      }
    }
  }
  for (const auto& s : sels) {
    for (std::int64_t ties : {-1, 0, 2}) {
      config c = preset("rule_80_20");
      c.select = s.second;
      c.use_given_cut = true;
      c.given_cut = 2.5;
      c.given_ties = ties;
      add(std::string("select_given_") + s.first + "_ties" + std::to_string(ties + 1), c);
    }
  }

  // Aggregations, constants and global normalisers.
  for (const auto& a : aggs) {
    config c = preset("grpo");
    c.agg = a.second;
    add(std::string("agg_") + a.first, c);
    c.norm_tokens = 300;
    c.norm_responses = 41;
    add(std::string("agg_global_") + a.first, c);
    c = preset("rule_80_20");
    c.agg = a.second;
    c.denom = denominator::kept;
    c.norm_kept_tokens = 70;
    c.norm_kept_responses = 13;
    c.norm_tokens = 250;
    c.norm_responses = 37;
    add(std::string("agg_global_kept_") + a.first, c);
  }
  {
    config c = preset("dr_grpo");
    c.sum_norm_constant = 37;
    add("agg_sum_norm_constant", c);
    c.sum_norm_constant = 0;
    c.sum_norm_max_length = 12;
    add("agg_sum_norm_max_length", c);
  }

  // KL estimators x clamp x straight-through.
  const std::pair<const char*, kl> kls[] = {{"k1", kl::k1}, {"abs", kl::abs}, {"k2", kl::k2}, {"k3", kl::k3}};
  for (const auto& k : kls) {
    for (int clamp = 0; clamp < 2; ++clamp) {
      for (int st = 0; st < 2; ++st) {
        config c = preset("grpo");
        c.kl_mode = k.second;
        c.kl_beta = 0.05;
        c.kl_clamp = clamp == 1;
        c.kl_straight_through = st == 1;
        add(std::string("kl_") + k.first + (clamp ? "_clamp" : "_noclamp") + (st ? "_st" : ""), c);
      }
    }
  }

  // Entropy bonus with every aggregation (and combined with selection and the KL).
  for (const auto& a : aggs) {
    config c = preset("reco");
    c.agg = a.second;
    c.entropy_bonus = true;
    c.entropy_coef = 0.01;
    add(std::string("entropy_") + a.first, c);
  }
  {
    config c = preset("rule_80_20_reco");
    c.entropy_bonus = true;
    c.kl_mode = kl::k2;
    add("entropy_with_selection_and_kl", c);
  }
  return out;
}

class ReferenceGradients : public ::testing::TestWithParam<named_config> {};

TEST_P(ReferenceGradients, AnalyticGradientMatchesFiniteDifferences) {
  const config& c = GetParam().cfg;
  // Clipping must occur somewhere (CISPO's range cannot be left once the log-ratio clamp keeps r
  // inside it).
  const bool cispo_unreachable = c.ratio_form == ratio::cispo && c.log_ratio_clamp > 0 &&
                                 c.log_ratio_clamp < std::log1p(c.cispo_eps_high);
  const bool clips = (c.clip_mode != clip::none || c.ratio_form == ratio::cispo || c.ratio_form == ratio::gmpo) &&
                     !cispo_unreachable;
  std::int64_t checked = 0, skipped = 0, invalid = 0, entropy_checked = 0;
  double worst = 0, clip_seen = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const batch b = random_batch(seed * 7919 + 17, shape_for_seed(seed));
    const fd_report rep = check_gradients(b, c);
    const output o = evaluate(b, c);
    checked += rep.checked;
    skipped += rep.skipped;
    invalid += rep.invalid;
    entropy_checked += rep.entropy_checked;
    worst = std::max(worst, rep.worst);
    clip_seen += o.clip_frac;
    if (HasFailure()) {
      ADD_FAILURE() << "config " << GetParam().name << ", seed " << seed;
      return;
    }
  }
  // The check compared many tokens and skipped only a few near kinks.
  EXPECT_GT(checked, 300);
  EXPECT_LE(skipped * 20, checked) << "too many tokens next to a kink";
  EXPECT_GT(invalid, 20);
  EXPECT_GT(entropy_checked, 300);
  // The off-policy regime reaches the clip somewhere in these batches.
  if (clips) {
    EXPECT_GT(clip_seen, 0) << "no token was clipped";
  }
  std::ostringstream worst_text;
  worst_text << std::scientific << worst;
  RecordProperty("worst_relative_error", worst_text.str());
}

INSTANTIATE_TEST_SUITE_P(AllComponents, ReferenceGradients, ::testing::ValuesIn(gradient_configs()),
                         [](const ::testing::TestParamInfo<named_config>& info) { return info.param.name; });

// The dual clips fire in the random batches the gradient check uses, for the presets that have
// one and for each ratio form it applies to (flipped_all only with the soft one: its A < 0 value
// -A / rho is kept at most -A / (1 - eps_low) < -A c by the PPO clip).
TEST(ReferenceGradients, DualClipRegimeOccurs) {
  std::vector<named_config> cases = {{"grpo", preset("grpo")}, {"dapo", preset("dapo")},
                                     {"aspo", preset("aspo")}, {"reco", preset("reco")},
                                     {"dapo_reco", preset("dapo_reco")}};
  const std::pair<const char*, ratio> forms[] = {
      {"token", ratio::token}, {"variance", ratio::variance}, {"flipped", ratio::flipped},
      {"flipped_all", ratio::flipped_all}, {"sequence", ratio::sequence}, {"gmpo", ratio::gmpo}};
  for (const auto& f : forms) {
    for (dual d : {dual::hard, dual::soft}) {
      if (f.second == ratio::flipped_all && d == dual::hard) continue;
      for (clip cl : {clip::ppo, clip::entropy_split}) {
        config c = preset("grpo");
        c.ratio_form = f.second;
        c.dual_mode = d;
        c.clip_mode = cl;
        cases.push_back({std::string(f.first) + (d == dual::hard ? "_hard" : "_soft"), c});
      }
    }
  }
  for (const auto& k : cases) {
    double dual_seen = 0;
    for (std::uint64_t seed = 1; seed <= 10; ++seed) {
      dual_seen += evaluate(random_batch(seed * 7919 + 17, shape_for_seed(seed)), k.cfg).dual_clip_frac;
    }
    EXPECT_GT(dual_seen, 0) << k.name << ": no token hit the dual clip";
  }
}

// The clamps that the gradient check must cover do bite in the random batches: the log-ratio
// clamp at 0.3, the k3 clamps with a wide reference, and the GSPO cap at 0.05.
TEST(ReferenceGradients, ClampRegimesOccur) {
  bool ratio_clamp = false, k3_clamp = false, seq_cap = false;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const batch b = random_batch(seed * 7919 + 17, shape_for_seed(seed));
    const std::vector<std::int64_t> owner = reco_ref_test::owners(b);
    for (std::int64_t t = 0; t < b.num_tokens; ++t) {
      if (owner[static_cast<std::size_t>(t)] < 0) continue;
      const double l = b.logp[static_cast<std::size_t>(t)] - b.old_logp[static_cast<std::size_t>(t)];
      const double d = b.logp[static_cast<std::size_t>(t)] - b.ref_logp[static_cast<std::size_t>(t)];
      ratio_clamp = ratio_clamp || std::fabs(l) > 0.3;
      k3_clamp = k3_clamp || std::expm1(-d) + d > 10 || std::fabs(d) > 20;
    }
    config c = preset("grpo");
    c.ratio_form = ratio::sequence;
    c.seq_max_log = 0.05;
    c.clip_mode = clip::none;
    c.dual_mode = dual::off;
    c.kl_mode = kl::none;
    c.adv = advantage::given;
    const output o = evaluate(b, c);
    seq_cap = seq_cap || o.ratio_max == std::exp(0.05);
  }
  EXPECT_TRUE(ratio_clamp);
  EXPECT_TRUE(k3_clamp);
  EXPECT_TRUE(seq_cap);
}

}  // namespace
