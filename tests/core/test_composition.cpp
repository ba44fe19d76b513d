// Objectives composed at run time (reco/composition.hpp): the same results as the fixed
// composition of the same components, bit for bit, for every preset; and random compositions
// (with rewards, or around given advantages per response or per token) against the independent
// reference, with finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/compare.hpp"
#include "core/named_argument.hpp"
#include "reco/composition.hpp"
#include "reco/given_advantages.hpp"
#include "reco/registry.hpp"

namespace {

using namespace reco_test;

void expect_named(const std::function<void()>& f, const std::string& argument) {
  EXPECT_EQ(named_argument(f), argument);
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every output of two calls, compared bit for bit.
void expect_identical(const library_output& a, const library_output& b, const std::string& label) {
  SCOPED_TRACE(label);
  const auto &x = a.result, &y = b.result;
  EXPECT_TRUE(same_bits(x.loss, y.loss)) << x.loss << " vs " << y.loss;
  EXPECT_TRUE(same_bits(x.policy_loss, y.policy_loss));
  EXPECT_TRUE(same_bits(x.kl_loss, y.kl_loss));
  EXPECT_TRUE(same_bits(x.entropy_loss, y.entropy_loss));
  EXPECT_EQ(x.status, y.status);
  const auto &s = x.stats, &t = y.stats;
  for (auto [u, v] : {std::pair{s.clip_frac, t.clip_frac}, {s.clip_frac_low, t.clip_frac_low},
                      {s.clip_frac_high, t.clip_frac_high}, {s.dual_clip_frac, t.dual_clip_frac},
                      {s.ppo_kl, t.ppo_kl}, {s.ratio_mean, t.ratio_mean}, {s.ratio_min, t.ratio_min},
                      {s.ratio_max, t.ratio_max}, {s.ref_kl_mean, t.ref_kl_mean}, {s.entropy_mean, t.entropy_mean},
                      {s.entropy_kept_mean, t.entropy_kept_mean}, {s.kept_frac, t.kept_frac},
                      {s.weight_mean, t.weight_mean}, {s.weight_min, t.weight_min}, {s.weight_max, t.weight_max},
                      {s.zero_std_group_frac, t.zero_std_group_frac}, {s.advantage_mean, t.advantage_mean},
                      {s.advantage_std, t.advantage_std}, {s.token_variance[0], t.token_variance[0]},
                      {s.token_variance[1], t.token_variance[1]}, {s.token_variance[2], t.token_variance[2]}})
    EXPECT_TRUE(same_bits(u, v)) << u << " vs " << v;
  EXPECT_EQ(s.weight_cap_hits, t.weight_cap_hits);
  EXPECT_EQ(s.valid_tokens, t.valid_tokens);
  EXPECT_EQ(s.policy_tokens, t.policy_tokens);
  ASSERT_EQ(a.grad_logp.size(), b.grad_logp.size());
  for (std::size_t k = 0; k < a.grad_logp.size(); ++k)
    ASSERT_TRUE(same_bits(a.grad_logp[k], b.grad_logp[k])) << "grad_logp[" << k << "] " << a.grad_logp[k] << " vs "
                                                           << b.grad_logp[k];
  ASSERT_EQ(a.grad_entropy.size(), b.grad_entropy.size());
  for (std::size_t k = 0; k < a.grad_entropy.size(); ++k)
    ASSERT_TRUE(same_bits(a.grad_entropy[k], b.grad_entropy[k])) << "grad_entropy[" << k << "]";
}

template <class Fixed, class Composed>
void expect_same_as_fixed(const Fixed& fixed, const Composed& composed, const std::string& name, std::uint64_t seed,
                          bool given) {
  const auto specs = standard_specs();
  for (std::size_t k = 0; k < specs.size(); k += 2) {
    batch_spec spec = specs[k];
    spec.token_advantages = given && k % 4 == 2;
    spec.response_weights = true;
    master_batch m = make_batch(seed + k, spec);
    master_batch m32 = m;
    round_to<float>(m32);
    for (bool vectorise : {true, false}) {
      const std::string label = name + " batch " + std::to_string(k) + path_name(vectorise);
      expect_identical(run_library<double>(composed, m, {}, vectorise), run_library<double>(fixed, m, {}, vectorise),
                       label + " double");
      expect_identical(run_library<float>(composed, m32, {}, vectorise),
                       run_library<float>(fixed, m32, {}, vectorise), label + " float");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A call's stages (reco/algorithm/call_stages.hpp) is derived from the object: a composition
// plans the stages, checks and needs of its fixed twin.
template <class Fixed, class Composed>
void expect_same_plan(const Fixed& fixed, const Composed& composed, const std::string& name) {
  SCOPED_TRACE(name + " plan");
  for (bool token_advantages : {false, true}) {
    const reco::detail::call_stages a = reco::detail::call_stages_of(fixed, true, token_advantages);
    const reco::detail::call_stages b = reco::detail::call_stages_of(composed, true, token_advantages);
    const reco::objective_stages &x = a.stages, &y = b.stages;
    EXPECT_EQ(x.finalize, y.finalize);
    EXPECT_EQ(x.old_mean, y.old_mean);
    EXPECT_EQ(x.sequence, y.sequence);
    EXPECT_EQ(x.sequence_in_finalize, y.sequence_in_finalize);
    EXPECT_EQ(x.selection, y.selection);
    EXPECT_EQ(x.covariance, y.covariance);
    EXPECT_EQ(x.kept_counts, y.kept_counts);
    EXPECT_EQ(x.entropy_quantile, y.entropy_quantile);
    EXPECT_EQ(a.checks.ref, b.checks.ref);
    EXPECT_EQ(a.checks.entropy, b.checks.entropy);
    EXPECT_EQ(a.checks.rewards, b.checks.rewards);
    EXPECT_EQ(a.checks.advantages, b.checks.advantages);
    EXPECT_EQ(a.checks.response_weights, b.checks.response_weights);
    EXPECT_EQ(a.needs.group_size, b.needs.group_size);
    EXPECT_EQ(a.needs.entropy_gradient, b.needs.entropy_gradient);
    EXPECT_EQ(a.reads_rewards, b.reads_rewards);
    EXPECT_EQ(a.token_advantages, b.token_advantages);
    EXPECT_EQ(a.kept_denominator, b.kept_denominator);
  }
}

TEST(Composition, EveryPresetEqualsItsFixedComposition) {
  int checked = 0;
  for (const std::string& name : reco::registry::known_preset_names()) {
    reco::registry::with_preset(name, [&](auto preset) {
      using P = decltype(preset);
      if constexpr (!reco::is_covariance_selection_v<typename P::selector_type>) {
        // (The presets around given advantages against composed_objective_given: bit for bit in
        // tests/torch/test_compose_ops.py, against the reference below; not here, where their
        // fixed types would be compiled a second time beside test_given_advantages.cpp.)
        const auto composed = reco::composed_from(preset);
        expect_same_plan(preset, composed, name);
        expect_same_as_fixed(preset, composed, name, 100 + 31 * checked, false);
        ++checked;
      }
    });
  }
  EXPECT_GE(checked, 25);
}

TEST(Composition, SpecAndKeysBuildTheSameObjectiveAsAFixedOne) {
  // ReCo's composition by name and keys = the reco preset.
  reco::composed_objective obj =
      reco::compose("advantage=grpo ratio=variance clip=ppo weight=expected_count kl=kl_penalty");
  reco::registry::apply_overrides(obj, reco::registry::override_list{
                                           {"clip.dual_clip", 1.0}, {"clip.dual_clip_c", 3.0}, {"weight.cap", 10.0}});
  expect_same_as_fixed(reco::presets::reco{}, obj, "reco by spec", 900, false);
  // A composition no preset spells: RLOO, GMPO's ratio without a clip, group-mean weights,
  // token-mean, 80/20 with the kept denominator, k2 KL and an entropy bonus.
  reco::composed_objective o2 = reco::compose(
      "advantage=rloo,ratio=gmpo,clip=none,weight=expected_count,aggregate=token_mean,select=top_entropy,"
      "kl=kl_penalty,entropy=entropy_bonus");
  reco::registry::apply_overrides(o2, reco::registry::override_list{{"weight.normalise", 1.0},
                                                                    {"select.denominator", 1.0},
                                                                    {"kl.estimator", 2.0},
                                                                    {"entropy.coef", 0.01}});
  reco::objective<reco::rloo_advantage, reco::gmpo_ratio, reco::no_clip, reco::expected_count_weight, reco::token_mean,
                  reco::top_entropy_selection, reco::kl_penalty, reco::entropy_bonus>
      fixed;
  fixed.weight.params.normalise = reco::weight_normalisation::group_mean;
  fixed.select.params.denominator = reco::selection_denominator::kept;
  fixed.kl.params.estimator = reco::kl_estimator::k2;
  fixed.entropy.params.coef = 0.01;
  expect_same_as_fixed(fixed, o2, "rloo gmpo", 950, false);
}

TEST(Composition, BadSpecsAndKeysAreNamed) {
  expect_named([] { reco::parse_composition("ratio=varience"); }, "composition.ratio");
  expect_named([] { reco::parse_composition("rato=variance"); }, "composition.rato");
  expect_named([] { reco::parse_composition("ratio=token ratio=variance"); }, "composition.ratio");
  expect_named([] { reco::parse_composition("ratio"); }, "composition");
  expect_named([] { reco::compose("advantage=given"); }, "composition.advantage");
  expect_named([] { reco::compose_given(reco::parse_composition("advantage=rloo")); }, "composition.advantage");
  // A self-clipped ratio form with a clip.
  expect_named([] { reco::compose("ratio=cispo clip=ppo").validate(); }, "clip.kind");
  // A key of a component that is not chosen, and of a term that is off.
  expect_named(
      [] {
        auto o = reco::compose("clip=none");
        reco::registry::set_override(o, "clip.eps_high", 0.28);
      },
      "overrides.clip.eps_high");
  expect_named(
      [] {
        auto o = reco::compose("ratio=token");
        reco::registry::set_override(o, "kl.beta", 0.1);
      },
      "overrides.kl.beta");
  expect_named(
      [] {
        auto o = reco::compose("ratio=token");
        reco::registry::set_override(o, "ratio.eps_high", 0.1);  // a cispo key
      },
      "overrides.ratio.eps_high");
  // The keys listed are those of the chosen components.
  auto o = reco::compose("ratio=cispo clip=none kl=kl_penalty");
  const auto keys = reco::registry::override_keys(o);
  auto has = [&](const std::string& k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
  EXPECT_TRUE(has("ratio.eps_high"));
  EXPECT_TRUE(has("kl.beta"));
  EXPECT_FALSE(has("clip.eps_high"));
  EXPECT_FALSE(has("entropy.coef"));
  EXPECT_FALSE(has("select.rho"));
}

// ---- random compositions against the reference ---------------------------------------------

struct drawn {
  std::string spec;
  reco::registry::override_list keys;
  reco_ref::config cfg;
};

drawn draw(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  drawn d;
  reco_ref::config& c = d.cfg;
  c.adv_eps = 1e-6;
  const char* adv_names[] = {"grpo", "dr_grpo", "rloo", "opo", "batch_std", "gpg", "reinforce_pp", "pass_at_k"};
  const reco_ref::advantage adv_ref[] = {reco_ref::advantage::grpo,  reco_ref::advantage::dr_grpo,
                                         reco_ref::advantage::rloo,  reco_ref::advantage::opo,
                                         reco_ref::advantage::batch_std, reco_ref::advantage::gpg,
                                         reco_ref::advantage::reinforce_pp, reco_ref::advantage::pass_at_k};
  const int a = pick(8);
  c.adv = adv_ref[a];
  if (a == 0 && pick(2)) {
    d.keys.emplace_back("advantage.eps", 1e-4);
    c.adv_eps = 1e-4;
  }
  const char* ratio_names[] = {"token", "sequence", "variance", "flipped", "reinforce",
                               "cispo", "sapo",     "gmpo",     "vespo",   "dppo"};
  const reco_ref::ratio ratio_ref[] = {reco_ref::ratio::token,     reco_ref::ratio::sequence, reco_ref::ratio::variance,
                                       reco_ref::ratio::flipped,   reco_ref::ratio::reinforce, reco_ref::ratio::cispo,
                                       reco_ref::ratio::sapo,      reco_ref::ratio::gmpo,     reco_ref::ratio::vespo,
                                       reco_ref::ratio::dppo};
  const int r = pick(10);
  c.ratio_form = ratio_ref[r];
  const bool self_clipped = r == 4 || r == 5 || r == 6 || r == 8 || r == 9;
  if (r == 3 && pick(2)) {
    d.keys.emplace_back("ratio.flip_all", 1.0);
    c.ratio_form = reco_ref::ratio::flipped_all;
  }
  if (r == 9 && pick(2)) {
    d.keys.emplace_back("ratio.divergence", 1.0);
    c.dppo_binary_kl = true;
  }
  const char* clip_names[] = {"none", "ppo", "entropy_split"};
  const int k = self_clipped ? 0 : pick(3);
  c.clip_mode = k == 0 ? reco_ref::clip::none : (k == 1 ? reco_ref::clip::ppo : reco_ref::clip::entropy_split);
  if (k >= 1 && pick(2)) {
    d.keys.emplace_back("clip.eps_high", 0.28);
    c.eps_high = 0.28;
  }
  if (k >= 1 && pick(2)) {
    const int dual = 1 + pick(2);
    d.keys.emplace_back("clip.dual_clip", dual);
    c.dual_mode = dual == 1 ? reco_ref::dual::hard : reco_ref::dual::soft;
  }
  const char* weight_names[] = {"uniform", "expected_count", "caller"};
  const int w = pick(3);
  c.weight_mode = w == 0 ? reco_ref::weight::uniform
                         : (w == 1 ? reco_ref::weight::expected_count : reco_ref::weight::caller);
  c.weight_cap = w == 1 ? 10 : 0;
  if (w >= 1 && pick(2)) {
    const double cap = w == 1 ? 2.0 : 1.5;
    d.keys.emplace_back("weight.cap", cap);
    c.weight_cap = cap;
  }
  if (w >= 1 && pick(3) == 0) {
    d.keys.emplace_back("weight.normalise", 1.0);
    c.weight_normalisation = reco_ref::weight_norm::group_mean;
  }
  const char* agg_names[] = {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
                             "seq_mean_token_sum_all"};
  const reco_ref::aggregation agg_ref[] = {reco_ref::aggregation::token_mean,
                                           reco_ref::aggregation::seq_mean_token_mean,
                                           reco_ref::aggregation::seq_mean_token_sum,
                                           reco_ref::aggregation::seq_mean_token_sum_norm,
                                           reco_ref::aggregation::seq_mean_token_sum_all};
  const int g = pick(5);
  c.agg = agg_ref[g];
  const bool select = pick(3) == 0;
  c.select = select ? reco_ref::selection::top_k : reco_ref::selection::all;
  if (select && pick(2)) {
    d.keys.emplace_back("select.rho", 0.5);
    c.rho = 0.5;
  }
  if (select && pick(2)) {
    d.keys.emplace_back("select.denominator", 1.0);
    c.denom = reco_ref::denominator::kept;
  }
  const bool kl = pick(2) == 0;
  c.kl_mode = reco_ref::kl::none;
  if (kl) {
    const int e = pick(4);
    const reco_ref::kl kl_ref[] = {reco_ref::kl::k1, reco_ref::kl::abs, reco_ref::kl::k2, reco_ref::kl::k3};
    c.kl_mode = kl_ref[e];
    d.keys.emplace_back("kl.estimator", e);
    d.keys.emplace_back("kl.beta", 0.05);
    c.kl_beta = 0.05;
  }
  const bool entropy = pick(4) == 0;
  c.entropy_bonus = entropy;
  if (entropy) {
    d.keys.emplace_back("entropy.coef", 0.01);
    c.entropy_coef = 0.01;
  }
  d.spec = std::string("advantage=") + adv_names[a] + " ratio=" + ratio_names[r] + " clip=" + clip_names[k] +
           " weight=" + weight_names[w] + " aggregate=" + agg_names[g] + " select=" + (select ? "top_entropy" : "all") +
           " kl=" + (kl ? "kl_penalty" : "none") + " entropy=" + (entropy ? "entropy_bonus" : "none");
  return d;
}

TEST(Composition, RandomCompositionsMatchTheReference) {
  std::mt19937_64 rng(20261124);
  const auto specs = standard_specs();
  const int count = 240;
  for (int n = 0; n < count; ++n) {
    drawn d = draw(rng);
    batch_spec spec = specs[static_cast<std::size_t>(n) % specs.size()];
    spec.response_weights = true;
    const bool given = n % 5 == 4;  // every 5th with given advantages (per token every 10th)
    spec.token_advantages = given && n % 10 == 9;
    const master_batch m = make_batch(40000 + static_cast<std::uint64_t>(n), spec);
    std::string label = "#" + std::to_string(n) + " " + d.spec;
    if (given) {
      // The same composition around given advantages: advantage=given, no estimator keys.
      d.spec = "advantage=given" + d.spec.substr(d.spec.find(' '));
      d.keys.erase(std::remove_if(d.keys.begin(), d.keys.end(),
                                  [](const auto& kv) { return kv.first.rfind("advantage.", 0) == 0; }),
                   d.keys.end());
      d.cfg.adv = reco_ref::advantage::given;
      label = "#" + std::to_string(n) + " " + d.spec;
      reco::composed_objective_given obj = reco::compose_given(reco::parse_composition(d.spec));
      reco::registry::apply_overrides(obj, d.keys);
      const reco_ref::output ref = reco_ref::evaluate(to_reference(m), d.cfg);
      expect_matches(run_library<double>(obj, m, {}, n % 2 == 0), ref, tolerances_for<double>(), label);
      if (n % 8 == 0) check_finite_differences(obj, d.cfg, label, 60000 + static_cast<std::uint64_t>(n));
    } else {
      reco::composed_objective obj = reco::compose(d.spec);
      reco::registry::apply_overrides(obj, d.keys);
      const reco_ref::output ref = reco_ref::evaluate(to_reference(m), d.cfg);
      expect_matches(run_library<double>(obj, m, {}, n % 2 == 0), ref, tolerances_for<double>(), label);
      if (n % 8 == 0) check_finite_differences(obj, d.cfg, label, 60000 + static_cast<std::uint64_t>(n));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
