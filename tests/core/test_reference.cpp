// Every preset against the independent reference (loss, gradients, diagnostics on 24 ragged
// batches, float and double), plus central finite differences in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/compare.hpp"
#include "reco/given_advantages.hpp"
#include "reco/presets.hpp"
#include "reco/registry.hpp"

namespace {

using namespace reco_test;

template <class Obj>
void check_preset(const std::string& name, std::uint64_t seed) {
  Obj obj;
  const reco_ref::config cfg = reco_ref::preset(name);
  check_against_reference(obj, cfg, name, seed);
  for (std::uint64_t k = 0; k < 4; ++k) check_finite_differences(obj, cfg, name, seed + 500 + k, k % 2 == 0);
}

TEST(Presets, Grpo) { check_preset<reco::presets::grpo>("grpo", 1); }
TEST(Presets, DrGrpo) { check_preset<reco::presets::dr_grpo>("dr_grpo", 2); }
TEST(Presets, Dapo) { check_preset<reco::presets::dapo>("dapo", 3); }
TEST(Presets, Gspo) { check_preset<reco::presets::gspo>("gspo", 4); }
TEST(Presets, Cispo) { check_preset<reco::presets::cispo>("cispo", 5); }
TEST(Presets, Aspo) { check_preset<reco::presets::aspo>("aspo", 6); }
TEST(Presets, Reco) { check_preset<reco::presets::reco>("reco", 7); }
TEST(Presets, RecoNoCap) { check_preset<reco::presets::reco_no_cap>("reco_no_cap", 8); }
TEST(Presets, RecoResponseOnly) { check_preset<reco::presets::reco_response_only>("reco_response_only", 9); }
TEST(Presets, RecoTokenOnly) { check_preset<reco::presets::reco_token_only>("reco_token_only", 10); }
TEST(Presets, DapoReco) { check_preset<reco::presets::dapo_reco>("dapo_reco", 11); }
TEST(Presets, Rule8020) { check_preset<reco::presets::rule_80_20>("rule_80_20", 12); }
TEST(Presets, Rule8020Reco) { check_preset<reco::presets::rule_80_20_reco>("rule_80_20_reco", 13); }
TEST(Presets, TrlBnpo) { check_preset<reco::presets::trl_bnpo>("trl_bnpo", 14); }
TEST(Presets, TrlLuspo) { check_preset<reco::presets::trl_luspo>("trl_luspo", 15); }
TEST(Presets, TrlVespo) { check_preset<reco::presets::trl_vespo>("trl_vespo", 16); }
TEST(Presets, Gpg) { check_preset<reco::presets::gpg>("gpg", 17); }
TEST(Presets, Sapo) { check_preset<reco::presets::sapo>("sapo", 18); }
TEST(Presets, ClipCov) { check_preset<reco::presets::clip_cov>("clip_cov", 19); }
TEST(Presets, KlCov) { check_preset<reco::presets::kl_cov>("kl_cov", 20); }
TEST(Presets, Dppo) { check_preset<reco::presets::dppo>("dppo", 21); }

// verl's loss_mode "dro", -(A logp - beta/2 (logp - old_logp)^2) token-mean, is not a preset (verl
// gives dro_beta no default) but a composition: REINFORCE plus a k2 KL term whose reference is the
// sampling policy (ref_logp = old_logp). Against the reference and against the formula itself.
TEST(Presets, DroComposition) {
  using dro = reco::objective<reco::given_advantage, reco::reinforce_ratio, reco::no_clip, reco::uniform_weight,
                              reco::token_mean, reco::kl_penalty>;
  dro obj;
  obj.kl.params.estimator = reco::kl_estimator::k2;
  obj.kl.params.beta = 0.1;
  reco_ref::config cfg = reco_ref::preset("gpg");
  cfg.adv = reco_ref::advantage::given;
  cfg.kl_mode = reco_ref::kl::k2;
  cfg.kl_beta = 0.1;
  const auto specs = standard_specs();
  for (std::size_t k = 0; k < specs.size(); k += 2) {
    master_batch m = make_batch(9100 + k, specs[k]);
    m.ref_logp = m.old_logp;
    m.token_weights.clear();  // verl's IS weights would multiply the penalty too (docs/peers.md)
    const library_output lib = run_library<double>(obj, m);
    expect_matches(lib, reco_ref::evaluate(to_reference(m), cfg), tolerances_for<double>(),
                   "dro batch " + std::to_string(k));
    double sum = 0, n = 0;  // the formula, token-mean over the valid tokens
    for (index_t i = 0; i < m.R; ++i)
      for (index_t t = m.begin(i); t < m.end(i); ++t) {
        const auto u = static_cast<std::size_t>(t);
        if (!m.mask[u]) continue;
        const double d = m.logp[u] - m.old_logp[u];
        sum += -(m.advantages[static_cast<std::size_t>(i)] * m.logp[u] - 0.05 * d * d);
        n += 1;
      }
    EXPECT_NEAR(lib.result.loss, n > 0 ? sum / n : 0.0, 1e-12 * (1 + std::fabs(sum / std::max(n, 1.0))));
  }
}

// Peer presets: the base preset's type with the peer's settings from the registry, against the
// reference's own spelling of that peer's defaults.
template <class Base>
void check_peer_preset(const std::string& name, std::uint64_t seed) {
  ASSERT_EQ(reco::registry::base_preset_index(name), reco::registry::preset_index(reco::registry::find_peer_preset(name)->base));
  Base obj;
  reco::registry::apply_peer_settings(obj, name);
  const reco_ref::config cfg = reco_ref::preset(name);
  check_against_reference(obj, cfg, name, seed);
  check_finite_differences(obj, cfg, name, seed + 500, true);
}

TEST(PeerPresets, EachAgainstTheReference) {
  const std::vector<std::string> expected = {"trl_dapo",     "trl_dr_grpo",  "trl_cispo", "verl_vanilla", "verl_cispo",
                                             "verl_dppo_tv", "verl_dppo_kl", "trl_sapo",  "openrlhf_ppo"};
  ASSERT_EQ(reco::registry::peer_preset_count, static_cast<int>(expected.size()));
  for (int k = 0; k < reco::registry::peer_preset_count; ++k)
    EXPECT_EQ(std::string(reco::registry::peer_preset_table[k].name), expected[k]);
  check_peer_preset<reco::presets::trl_bnpo>("trl_dapo", 31);
  check_peer_preset<reco::presets::dr_grpo>("trl_dr_grpo", 32);
  check_peer_preset<reco::presets::cispo>("trl_cispo", 33);
  check_peer_preset<reco::presets::dapo>("verl_vanilla", 34);
  check_peer_preset<reco::presets::cispo>("verl_cispo", 35);
  check_peer_preset<reco::presets::dppo>("verl_dppo_tv", 38);
  check_peer_preset<reco::presets::dppo>("verl_dppo_kl", 39);
  check_peer_preset<reco::presets::sapo>("trl_sapo", 37);
  check_peer_preset<reco::presets::dapo>("openrlhf_ppo", 36);
}

// The preset constants themselves (docs/presets.md lists them with their sources).
TEST(Presets, Constants) {
  reco::presets::grpo grpo;
  EXPECT_EQ(grpo.clip.params.eps_low, 0.2);
  EXPECT_EQ(grpo.clip.params.eps_high, 0.2);
  EXPECT_EQ(grpo.clip.params.dual_clip, reco::dual_clip_mode::hard);
  EXPECT_EQ(grpo.clip.params.dual_clip_c, 3.0);
  EXPECT_EQ(grpo.kl.params.beta, 0.001);
  EXPECT_EQ(grpo.kl.params.estimator, reco::kl_estimator::k3);
  EXPECT_EQ(grpo.advantage.params.eps, 1e-6);
  reco::presets::dapo dapo;
  EXPECT_EQ(dapo.clip.params.eps_high, 0.28);
  EXPECT_EQ(dapo.clip.params.dual_clip_c, 10.0);
  reco::presets::gspo gspo;
  EXPECT_EQ(gspo.clip.params.eps_low, 3e-4);
  EXPECT_EQ(gspo.clip.params.eps_high, 4e-4);
  reco::presets::aspo aspo;
  EXPECT_EQ(aspo.clip.params.dual_clip, reco::dual_clip_mode::soft);
  reco::presets::reco r;
  EXPECT_EQ(r.weight.params.cap, 10.0);
  EXPECT_EQ(r.ratio.params.variance_floor, 1e-12);
  reco::presets::rule_80_20 rule;
  EXPECT_EQ(rule.select.params.rho, 0.2);
  EXPECT_EQ(rule.select.params.rule, reco::selection_rule::top_k);
  EXPECT_EQ(rule.select.params.denominator, reco::selection_denominator::valid);
  reco::presets::trl_bnpo bnpo;
  EXPECT_EQ(bnpo.advantage.params.eps, 1e-4);
  EXPECT_EQ(bnpo.ratio.params.log_ratio_clamp, 0.0);
  EXPECT_EQ(bnpo.clip.params.eps_low, 0.2);
  EXPECT_EQ(bnpo.clip.params.eps_high, 0.2);
  EXPECT_EQ(bnpo.clip.params.dual_clip, reco::dual_clip_mode::off);
  EXPECT_EQ(bnpo.clip.params.delta, 0.0);
  reco::presets::trl_luspo luspo;
  EXPECT_EQ(luspo.advantage.params.eps, 1e-4);
  EXPECT_EQ(luspo.clip.params.eps_low, 0.2);
  EXPECT_EQ(luspo.clip.params.dual_clip, reco::dual_clip_mode::off);
  reco::presets::trl_vespo vespo;
  EXPECT_EQ(vespo.advantage.params.eps, 1e-4);
  EXPECT_EQ(vespo.ratio.params.k_pos, 2.0);
  EXPECT_EQ(vespo.ratio.params.lambda_pos, 3.0);
  EXPECT_EQ(vespo.ratio.params.k_neg, 3.0);
  EXPECT_EQ(vespo.ratio.params.lambda_neg, 2.0);
}

}  // namespace
