// Given advantages in place of every preset's estimator (reco::with_given_advantages): the
// estimator's own advantages, given, reproduce the rewards-based loss and gradient; arbitrary given
// advantages match the independent reference (values and finite differences).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/compare.hpp"
#include "core/named_argument.hpp"
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

// f(name, the preset around given advantages, the reference's config of it) for every preset.
template <class F>
void for_each_given_preset(F f) {
  for (const std::string& name : reco::registry::preset_names())
    reco::registry::with_preset(name, [&](auto obj) {
      reco_ref::config cfg = reco_ref::preset(name);
      cfg.adv = reco_ref::advantage::given;
      f(name, reco::with_given_advantages(obj), cfg);
    });
}

TEST(GivenAdvantages, ArbitraryAdvantagesMatchTheReference) {
  for_each_given_preset([](const std::string& name, const auto& given, const reco_ref::config& cfg) {
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

// ---- advantages per token (batch.token_advantages: GAE, token baselines) ----------------------

TEST(TokenAdvantages, EveryPresetMatchesTheReference) {
  for_each_given_preset([](const std::string& name, const auto& given, const reco_ref::config& cfg) {
    const auto specs = standard_specs();
    for (std::size_t k = 0; k < specs.size(); k += 3) {
      batch_spec spec = specs[k];
      spec.token_advantages = true;
      const master_batch m0 = make_batch(8200 + k, spec);
      master_batch m32 = m0;
      round_to<float>(m32);
      const reco_ref::output ref64 = reco_ref::evaluate(to_reference(m0), cfg);
      const reco_ref::output ref32 = reco_ref::evaluate(to_reference(m32), cfg);
      const std::string label = name + " token advantages, batch " + std::to_string(k);
      for (bool vectorise : {true, false}) {
        const library_output lib = run_library<double>(given, m0, {}, vectorise);
        expect_matches(lib, ref64, tolerances_for<double>(), label + path_name(vectorise));
        expect_matches(run_library<float>(given, m32, {}, vectorise), ref32, tolerances_for<float>(),
                       label + " float" + path_name(vectorise));
        for (std::size_t t = 0; t < m0.mask.size(); ++t) {
          if (!m0.mask[t]) {
            ASSERT_EQ(lib.grad_logp[t], 0.0) << label << ": masked token " << t;
          }
        }
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    check_finite_differences(given, cfg, name + " token advantages", 8300, true, true);
    check_finite_differences(given, cfg, name + " token advantages", 8301, false, true);
  });
}

// A_t = A_i at every token of response i is the per-response call (to rounding): the per-token
// path changes where A is read, not the math.
TEST(TokenAdvantages, ConstantAlongEachResponseIsThePerResponseCall) {
  for (const std::string& name : reco::registry::preset_names()) {
    reco::registry::with_preset(name, [&](auto obj) {
      const auto given = reco::with_given_advantages(obj);
      const auto specs = standard_specs();
      for (std::size_t k = 2; k < specs.size(); k += 5) {
        const master_batch m = make_batch(8400 + k, specs[k]);
        master_batch mt = m;
        mt.token_advantages.assign(m.logp.size(), 0.0);
        for (index_t i = 0; i < m.R; ++i)
          for (index_t t = m.begin(i); t < m.end(i); ++t)
            mt.token_advantages[static_cast<std::size_t>(t)] = m.advantages[static_cast<std::size_t>(i)];
        mt.advantages.clear();
        const library_output per_token = run_library<double>(given, mt);
        expect_same_loss(per_token, run_library<double>(given, m), name + " batch " + std::to_string(k));
        EXPECT_TRUE(close(per_token.result.stats.advantage_std, run_library<double>(given, m).result.stats.advantage_std,
                          1e-12, 1e-14, "advantage_std"));
      }
    });
  }
}

TEST(TokenAdvantages, BadInputIsNamed) {
  batch_spec spec;
  spec.token_advantages = true;
  const master_batch m = make_batch(8500, spec);
  const auto given = reco::with_given_advantages(reco::presets::grpo{});
  typed_batch<double> tb(m);
  std::vector<double> g(m.logp.size());
  reco::workspace<reco::cpu> ws;
  auto call = [&](const auto& obj, const reco::batch_view<double>& v) {
    return named_argument([&] { obj(reco::cpu{}, v, reco::gradients<double>{g, {}}, ws); });
  };
  EXPECT_EQ(call(given, tb.view()), "");

  // Per response and per token at once.
  const std::vector<double> per_response(static_cast<std::size_t>(m.R), 0.5);
  auto both = tb.view();
  both.advantages = per_response;
  EXPECT_EQ(call(given, both), "batch.token_advantages");
  // An estimator that computes its own advantages would ignore them.
  EXPECT_EQ(call(reco::presets::grpo{}, tb.view()), "batch.token_advantages");
  // Neither: the per-response input is named.
  auto neither = tb.view();
  neither.token_advantages = {};
  EXPECT_EQ(call(given, neither), "batch.advantages");
  // One per token.
  auto short_view = tb.view();
  short_view.token_advantages = reco::span<const double>(tb.token_advantages.data(), m.N - 1);
  EXPECT_EQ(call(given, short_view), "batch.token_advantages");

  // Not finite at a valid token: named with its position; at a masked token: not read.
  std::size_t valid_t = 0, masked_t = 0;
  while (!m.mask[valid_t]) ++valid_t;
  while (m.mask[masked_t]) ++masked_t;
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    typed_batch<double> tv(m);
    tv.token_advantages[valid_t] = bad;
    try {
      given(reco::cpu{}, tv.view(), reco::gradients<double>{g, {}}, ws);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), "batch.token_advantages");
      EXPECT_NE(std::string(e.what()).find("token " + std::to_string(valid_t)), std::string::npos) << e.what();
    }
  }
  typed_batch<double> tm(m);
  tm.token_advantages[masked_t] = std::nan("");
  std::vector<double> gm(m.logp.size());
  const reco::objective_result rm = given(reco::cpu{}, tm.view(), reco::gradients<double>{gm, {}}, ws);
  const reco::objective_result r0 = given(reco::cpu{}, tb.view(), reco::gradients<double>{g, {}}, ws);
  EXPECT_EQ(rm.loss, r0.loss);
  EXPECT_EQ(gm[masked_t], 0.0);

  // A batch without tokens reads no advantage: neither input is needed (its token advantages
  // would be empty too), and the loss is 0.
  const std::vector<index_t> offsets{0, 0, 0, 0};
  const std::vector<index_t> groups{0, 3};
  reco::batch_view<double> none;
  none.layout = reco::packed(offsets);
  none.group_offsets = groups;
  std::vector<double> g0;
  const auto reco_given = reco::with_given_advantages(reco::presets::reco{});
  const reco::objective_result r = reco_given(reco::cpu{}, none, reco::gradients<double>{g0, {}}, ws);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.stats.valid_tokens, 0);
}

}  // namespace
