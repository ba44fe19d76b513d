// Given advantages in place of every preset's estimator (reco::with_given_advantages): the
// estimator's own advantages, given, reproduce the rewards-based loss and gradient; arbitrary given
// advantages match the independent reference (values and finite differences).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/compare.hpp"
#include "reco/given_advantages.hpp"
#include "reco/objective_needs.hpp"
#include "reco/registry.hpp"

namespace {

using namespace reco_test;

// Loss and gradient of two runs equal to rounding.
void expect_same_loss(const library_output& a, const library_output& b, const std::string& label) {
  SCOPED_TRACE(label);
  const double scale = std::max({std::fabs(b.result.policy_loss), std::fabs(b.result.kl_loss), 1e-3});
  EXPECT_TRUE(close(a.result.loss, b.result.loss, 1e-12, 1e-14 * scale, "loss"));
  EXPECT_TRUE(close(a.result.policy_loss, b.result.policy_loss, 1e-12, 1e-14 * scale, "policy_loss"));
  EXPECT_TRUE(close(a.result.kl_loss, b.result.kl_loss, 1e-12, 1e-14 * scale, "kl_loss"));
  ASSERT_EQ(a.grad_logp.size(), b.grad_logp.size());
  double gmax = 0;
  for (double x : b.grad_logp) gmax = std::max(gmax, std::fabs(x));
  for (std::size_t t = 0; t < a.grad_logp.size(); ++t)
    ASSERT_TRUE(close(a.grad_logp[t], b.grad_logp[t], 1e-12, 1e-14 * gmax, "grad_logp[" + std::to_string(t) + "]"));
  EXPECT_EQ(a.result.stats.weight_cap_hits, b.result.stats.weight_cap_hits);
  EXPECT_TRUE(close(a.result.stats.weight_mean, b.result.stats.weight_mean, 1e-12, 0, "weight_mean"));
}

TEST(GivenAdvantages, EveryPresetReproducesItsEstimator) {
  const auto specs = standard_specs();
  for (const std::string& name : reco::registry::preset_names()) {
    reco::registry::with_preset(name, [&](auto obj) {
      const auto given = reco::with_given_advantages(obj);
      using G = std::decay_t<decltype(given)>;
      static_assert(G::needs_advantages && !G::needs_rewards, "the swapped slot reads advantages");
      const reco_ref::config cfg = reco_ref::preset(name);
      for (std::size_t k = 0; k < specs.size(); k += 3) {
        master_batch m = make_batch(7000 + k, specs[k]);
        // The estimator's final advantages, from the independent reference.
        const reco_ref::output ref = reco_ref::evaluate(to_reference(m), cfg);
        m.advantages = ref.advantages;
        const std::string label = name + " batch " + std::to_string(k);
        for (bool vectorise : {true, false}) {
          expect_same_loss(run_library<double>(given, m, {}, vectorise), run_library<double>(obj, m, {}, vectorise),
                           label + path_name(vectorise));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    });
  }
}

TEST(GivenAdvantages, ArbitraryAdvantagesMatchTheReference) {
  for (const std::string& name : reco::registry::preset_names()) {
    reco::registry::with_preset(name, [&](auto obj) {
      const auto given = reco::with_given_advantages(obj);
      reco_ref::config cfg = reco_ref::preset(name);
      cfg.adv = reco_ref::advantage::given;
      const auto specs = standard_specs();
      for (std::size_t k = 1; k < specs.size(); k += 4) {
        const master_batch m = make_batch(8000 + k, specs[k]);
        const reco_ref::output ref = reco_ref::evaluate(to_reference(m), cfg);
        for (bool vectorise : {true, false})
          expect_matches(run_library<double>(given, m, {}, vectorise), ref, tolerances_for<double>(),
                         name + " given, batch " + std::to_string(k) + path_name(vectorise));
      }
      check_finite_differences(given, cfg, name + " given", 8100, true);
      check_finite_differences(given, cfg, name + " given", 8101, false);
    });
  }
}

TEST(GivenAdvantages, ParametersOtherThanTheEstimatorsAreKept) {
  reco::presets::reco obj;
  obj.clip.params.eps_high = 0.31;
  obj.weight.params.cap = 4.0;
  obj.kl.params.beta = 0.05;
  const auto given = reco::with_given_advantages(obj);
  EXPECT_EQ(given.clip.params.eps_high, 0.31);
  EXPECT_EQ(given.weight.params.cap, 4.0);
  EXPECT_EQ(given.kl.params.beta, 0.05);
  EXPECT_EQ(given.clip.params.dual_clip_c, obj.clip.params.dual_clip_c);
}

TEST(GivenAdvantages, NeedsNameTheGroupSize) {
  // ReCo's weight 1/(G pbar_old) reads G; a uniform weight does not.
  const reco::objective_needs r = reco::needs_of<decltype(reco::with_given_advantages(reco::presets::reco{}))>();
  EXPECT_TRUE(r.advantages);
  EXPECT_FALSE(r.rewards);
  EXPECT_TRUE(r.group_size);
  const reco::objective_needs d = reco::needs_of<decltype(reco::with_given_advantages(reco::presets::dapo{}))>();
  EXPECT_FALSE(d.group_size);
  EXPECT_TRUE(reco::needs_of<reco::presets::dapo_reco>().group_size);
  EXPECT_FALSE(reco::needs_of<reco::presets::grpo>().group_size);
}

}  // namespace
