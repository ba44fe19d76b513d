// The registry (reco/registry.hpp): presets by name and parameters by key, as both adapters use
// them. Expected values are written out here from the presets' documented constants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "reco/advantage/batch_std.hpp"
#include "reco/advantage/gpg.hpp"
#include "reco/advantage/opo.hpp"
#include "reco/advantage/pass_at_k.hpp"
#include "reco/advantage/reinforce_pp.hpp"
#include "reco/advantage/rloo.hpp"
#include "reco/aggregate/seq_mean_token_sum_norm.hpp"
#include "reco/batch_ops/estimate_advantages.hpp"
#include "reco/clip/entropy_split_clip.hpp"
#include "reco/entropy/entropy_bonus.hpp"
#include "reco/ratio/gmpo.hpp"
#include "reco/ratio/reinforce.hpp"
#include "reco/ratio/sapo.hpp"
#include "reco/registry.hpp"
#include "reco/weight/caller_weight.hpp"

namespace {

namespace rg = reco::registry;

template <class F>
reco::error caught(F&& f) {
  try {
    f();
  } catch (const reco::error& e) {
    return e;
  }
  ADD_FAILURE() << "expected reco::error";
  return reco::error("", "");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<std::string> expected_names = {
    "grpo", "dr_grpo",         "dapo",      "gspo",       "cispo",           "aspo",           "reco",
    "reco_no_cap", "reco_response_only", "reco_token_only", "dapo_reco", "rule_80_20", "rule_80_20_reco",
    "trl_bnpo", "trl_luspo", "trl_vespo", "gpg", "sapo", "clip_cov", "kl_cov", "dppo"};

TEST(Registry, NamesRoundTrip) {
  ASSERT_EQ(rg::preset_count, 21);
  EXPECT_EQ(rg::preset_names(), expected_names);
  for (int k = 0; k < rg::preset_count; ++k) {
    EXPECT_EQ(std::string(rg::preset_name(k)), expected_names[k]);
    EXPECT_EQ(rg::preset_index(expected_names[k]), k);
  }
  EXPECT_EQ(rg::preset_name(-1), nullptr);
  EXPECT_EQ(rg::preset_name(rg::preset_count), nullptr);
  // The name leads to the preset type of that name.
  auto type_of = [](const std::string& n) { return rg::with_preset(n, [](auto obj) { return std::string(typeid(obj).name()); }); };
  EXPECT_EQ(type_of("grpo"), typeid(reco::presets::grpo).name());
  EXPECT_EQ(type_of("gspo"), typeid(reco::presets::gspo).name());
  EXPECT_EQ(type_of("reco"), typeid(reco::presets::reco).name());
  EXPECT_EQ(type_of("reco_no_cap"), typeid(reco::presets::reco_no_cap).name());
  EXPECT_EQ(type_of("rule_80_20_reco"), typeid(reco::presets::rule_80_20_reco).name());
}

TEST(Registry, UnknownPresetNamesPresetAndListsTheKnownOnes) {
  const reco::error e = caught([] { rg::preset_index("grpoo"); });
  EXPECT_EQ(e.argument(), "preset");
  EXPECT_TRUE(contains(e.what(), "'grpoo'")) << e.what();
  for (const std::string& n : expected_names) EXPECT_TRUE(contains(e.what(), n)) << n;
  EXPECT_EQ(caught([] { rg::with_preset("", [](auto) {}); }).argument(), "preset");
  EXPECT_EQ(caught([] { rg::preset_override_keys("nope"); }).argument(), "preset");
  EXPECT_EQ(caught([] { rg::needs_of_preset(rg::preset_count); }).argument(), "preset");
}

TEST(Registry, IndexRangesVisitOnlyTheirPresets) {
  // Three ranges, as a library splitting the presets over translation units would use them.
  for (int k = 0; k < rg::preset_count; ++k) {
    std::string seen;
    int hits = 0;
    auto f = [&](auto obj) {
      seen = typeid(obj).name();
      ++hits;
    };
    const bool a = rg::visit_preset<0, 5>(k, f);
    const bool b = rg::visit_preset<5, 9>(k, f);
    const bool c = rg::visit_preset<9, rg::preset_count>(k, f);
    EXPECT_EQ(hits, 1) << k;
    EXPECT_EQ(a, k < 5);
    EXPECT_EQ(b, k >= 5 && k < 9);
    EXPECT_EQ(c, k >= 9);
    EXPECT_EQ(seen, rg::with_preset(expected_names[k], [](auto obj) { return std::string(typeid(obj).name()); }));
  }
  EXPECT_FALSE((rg::visit_preset<0, rg::preset_count>(-1, [](auto) {})));
  EXPECT_FALSE((rg::visit_preset<0, rg::preset_count>(rg::preset_count, [](auto) {})));
}

TEST(Registry, NeedsOfPresets) {
  // KL term: grpo, aspo and the reco family except dapo_reco; entropy: the 80/20 presets.
  const std::vector<std::string> with_kl = {"grpo", "aspo", "reco", "reco_no_cap", "reco_response_only",
                                            "reco_token_only"};
  for (const std::string& n : expected_names) {
    const reco::objective_needs needs = rg::needs_of_preset(n);
    const bool kl = std::find(with_kl.begin(), with_kl.end(), n) != with_kl.end();
    EXPECT_EQ(needs.ref_logp, kl) << n;
    EXPECT_EQ(needs.entropy, n.rfind("rule_80_20", 0) == 0) << n;
    EXPECT_TRUE(needs.rewards) << n;
    EXPECT_FALSE(needs.advantages) << n;
    EXPECT_FALSE(needs.response_weights) << n;
    EXPECT_FALSE(needs.entropy_gradient) << n;
    EXPECT_EQ(rg::needs_of_preset(rg::preset_index(n)).ref_logp, kl) << n;
  }
}

// A value the field accepts that differs from `now`.
double another_value(const rg::field_info& f, double now) {
  switch (f.kind) {
    case rg::field_kind::flag:
      return now == 0.0 ? 1.0 : 0.0;
    case rg::field_kind::choice:
      return std::fmod(now + 1.0, static_cast<double>(f.labels.size()));
    case rg::field_kind::real:
      break;
  }
  return now == 0.0 ? 0.5 : now * 0.75;
}

TEST(Registry, EveryKeyOfEveryPresetSetsAndReadsBack) {
  for (const std::string& name : expected_names) {
    rg::with_preset(name, [&](auto preset) {
      const auto fields = rg::override_fields(preset);
      ASSERT_FALSE(fields.empty()) << name;
      EXPECT_EQ(rg::override_keys(preset).size(), fields.size());
      for (const rg::field_info& f : fields) {
        auto obj = preset;
        const double before = rg::get_override(obj, f.key);
        const double after = another_value(f, before);
        ASSERT_NE(before, after) << name << " " << f.key;
        rg::apply_overrides(obj, std::map<std::string, double>{{f.key, after}});
        EXPECT_EQ(rg::get_override(obj, f.key), after) << name << " " << f.key;
        // Only that key changed.
        for (const rg::field_info& other : fields) {
          if (other.key == f.key) continue;
          EXPECT_EQ(rg::get_override(obj, other.key), rg::get_override(preset, other.key))
              << name << ": setting " << f.key << " changed " << other.key;
        }
      }
    });
  }
}

TEST(Registry, KeysReachTheComponentsParameters) {
  reco::presets::reco obj;
  rg::apply_overrides(obj, rg::override_list{{"clip.eps_high", 0.28},
                                             {"clip.dual_clip", 2},
                                             {"weight.cap", 4},
                                             {"weight.normalise", 1},
                                             {"kl.beta", 0.01},
                                             {"kl.estimator", 1},
                                             {"kl.clamp", 0},
                                             {"ratio.variance_floor", 1e-9},
                                             {"advantage.scale_by_std", 0},
                                             {"advantage.singleton", 1}});
  EXPECT_EQ(obj.clip.params.eps_high, 0.28);
  EXPECT_EQ(obj.clip.params.eps_low, 0.2);
  EXPECT_EQ(obj.clip.params.dual_clip, reco::dual_clip_mode::soft);
  EXPECT_EQ(obj.weight.params.cap, 4.0);
  EXPECT_EQ(obj.weight.params.normalise, reco::weight_normalisation::group_mean);
  EXPECT_EQ(obj.kl.params.beta, 0.01);
  EXPECT_EQ(obj.kl.params.estimator, reco::kl_estimator::abs);
  EXPECT_FALSE(obj.kl.params.clamp);
  EXPECT_EQ(obj.ratio.params.variance_floor, 1e-9);
  EXPECT_FALSE(obj.advantage.params.scale_by_std);
  EXPECT_EQ(obj.advantage.params.singleton, reco::singleton_policy::raw_score);
  reco::presets::rule_80_20 sel;
  rg::set_override(sel, "select.rule", 1);
  rg::set_override(sel, "select.denominator", 1);
  EXPECT_EQ(sel.select.params.rule, reco::selection_rule::quantile);
  EXPECT_EQ(sel.select.params.denominator, reco::selection_denominator::kept);
  rg::apply_overrides(sel, {{"select.rho", 0.3}});  // a braced list, as the docs write it
  EXPECT_EQ(sel.select.params.rho, 0.3);
}

TEST(Registry, KeysOfComposedObjectives) {
  // Components outside the presets declare their fields too (in their own headers).
  using obj_t = reco::objective<reco::rloo_advantage, reco::sapo_ratio, reco::no_clip, reco::caller_weight,
                                reco::seq_mean_token_sum_norm, reco::entropy_bonus>;
  const std::vector<std::string> keys = {"advantage.singleton", "ratio.tau_pos",      "ratio.tau_neg",
                                         "ratio.log_ratio_clamp", "weight.cap",        "weight.normalise",
                                         "aggregate.constant",  "aggregate.max_length", "entropy.coef"};
  EXPECT_EQ(rg::override_keys(obj_t{}), keys);
  using split_t = reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::entropy_split_clip,
                                  reco::uniform_weight, reco::token_mean>;
  const std::vector<std::string> split_keys = {
      "advantage.eps",          "advantage.unbiased_variance", "advantage.singleton",
      "ratio.eps_low",          "ratio.eps_high",              "clip.eps_low",
      "clip.eps_high",          "clip.high_entropy_eps_low",   "clip.high_entropy_eps_high",
      "clip.percentile",        "clip.dual_clip",              "clip.dual_clip_c"};
  EXPECT_EQ(rg::override_keys(split_t{}), split_keys);
  split_t s;
  rg::set_override(s, "clip.percentile", 0.9);
  EXPECT_EQ(s.clip.params.percentile, 0.9);
  // Every built-in component with parameters declares fields.
  static_assert(rg::has_fields_v<reco::batch_std_advantage> && rg::has_fields_v<reco::gpg_advantage> &&
                rg::has_fields_v<reco::opo_advantage> && rg::has_fields_v<reco::pass_at_k_advantage> &&
                rg::has_fields_v<reco::dr_grpo_advantage> && rg::has_fields_v<reco::reinforce_ratio> &&
                rg::has_fields_v<reco::top_entropy_selection> && rg::has_fields_v<reco::kl_penalty>);
  static_assert(!rg::has_fields_v<reco::no_clip> && !rg::has_fields_v<reco::token_mean>);
}

// A user component as docs/extending.md declares it: fields beside its parameters, and an
// enumeration whose labels sit beside it (found by argument-dependent lookup from this namespace).
namespace user {
enum class log_clip_side : std::uint8_t { both, upper };
constexpr reco::choice_labels<2> labels_of(log_clip_side) { return {{"both", "upper"}}; }

struct log_clip {
  using role = reco::roles::clip_policy;
  struct params_type {
    double delta = 0.2;
    log_clip_side side = log_clip_side::both;
  };
  params_type params{};
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("delta", p.delta);
    v("side", p.side);
  }
  static constexpr bool needs_entropy = false;
  static constexpr bool needs_entropy_quantile = false;
  static constexpr bool clips = true;
  reco::surrogate_value apply(const reco::ratio_value& rv, const reco::token_context& c) const {
    reco::surrogate_value s;
    s.x = rv.x;
    const double lx = std::log(rv.x);
    s.clipped = (lx > params.delta && c.advantage > 0) ||
                (params.side == log_clip_side::both && lx < -params.delta && c.advantage < 0);
    s.loss = -c.advantage * (s.clipped ? std::exp(lx > 0 ? params.delta : -params.delta) : rv.x);
    s.grad = s.clipped ? 0.0 : -c.advantage * rv.omega;
    return s;
  }
};
}  // namespace user

TEST(Registry, UserComponentDeclaresItsFieldsOnce) {
  using obj_t = reco::objective<reco::grpo_advantage, reco::token_ratio, user::log_clip, reco::uniform_weight,
                                reco::token_mean>;
  obj_t obj;
  const auto fields = rg::override_fields(obj);
  ASSERT_EQ(fields.size(), 6u);  // advantage.eps, .scale_by_std, .singleton, ratio.log_ratio_clamp, clip.*
  EXPECT_EQ(fields[4].key, "clip.delta");
  EXPECT_EQ(fields[4].kind, rg::field_kind::real);
  EXPECT_EQ(fields[5].key, "clip.side");
  EXPECT_EQ(fields[5].kind, rg::field_kind::choice);
  EXPECT_EQ(fields[5].labels, (std::vector<std::string>{"both", "upper"}));
  rg::apply_overrides(obj, {{"clip.delta", 0.1}, {"clip.side", 1}});
  EXPECT_EQ(obj.clip.params.delta, 0.1);
  EXPECT_EQ(obj.clip.params.side, user::log_clip_side::upper);
  const reco::error e = caught([&] { rg::set_override(obj, "clip.side", 2); });
  EXPECT_EQ(e.argument(), "overrides.clip.side");
  EXPECT_TRUE(contains(e.what(), "0 (both), 1 (upper)")) << e.what();
}

TEST(Registry, BadValuesAndKeysAreNamed) {
  auto arg = [](const char* preset, const std::string& key, double value) {
    return caught([&] {
             rg::with_preset(preset, [&](auto obj) {
               rg::apply_overrides(obj, rg::override_list{{key, value}}, "preset '" + std::string(preset) + "'");
             });
           });
  };
  // Flags take 0 or 1.
  for (double v : {0.5, 2.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    const reco::error e = arg("grpo", "kl.clamp", v);
    EXPECT_EQ(e.argument(), "overrides.kl.clamp") << v;
    EXPECT_TRUE(contains(e.what(), "0 or 1")) << e.what();
  }
  // Choices take an index of their labels, and the error lists them.
  for (double v : {3.0, -1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), 1e12}) {
    const reco::error e = arg("grpo", "clip.dual_clip", v);
    EXPECT_EQ(e.argument(), "overrides.clip.dual_clip") << v;
    EXPECT_TRUE(contains(e.what(), "0 (off), 1 (hard), 2 (soft)")) << e.what();
  }
  EXPECT_EQ(arg("reco", "weight.cap", std::numeric_limits<double>::quiet_NaN()).argument(), "overrides.weight.cap");
  EXPECT_EQ(arg("rule_80_20", "select.rule", 2).argument(), "overrides.select.rule");
  EXPECT_EQ(arg("reco", "weight.normalise", 3).argument(), "overrides.weight.normalise");
  EXPECT_EQ(arg("reco", "kl.estimator", 4).argument(), "overrides.kl.estimator");
  EXPECT_EQ(arg("grpo", "advantage.singleton", 3).argument(), "overrides.advantage.singleton");
  // Unknown keys: a typo, a component the preset lacks, no component at all; the message lists
  // the preset's keys.
  const reco::error typo = arg("grpo", "clip.eps_lo", 0.1);
  EXPECT_EQ(typo.argument(), "overrides.clip.eps_lo");
  EXPECT_TRUE(contains(typo.what(), "preset 'grpo'")) << typo.what();
  EXPECT_TRUE(contains(typo.what(), "clip.eps_low, clip.eps_high")) << typo.what();
  EXPECT_EQ(arg("grpo", "weight.cap", 5).argument(), "overrides.weight.cap");
  EXPECT_EQ(arg("dapo", "kl.beta", 0.1).argument(), "overrides.kl.beta");
  EXPECT_EQ(arg("grpo", "eps", 0.1).argument(), "overrides.eps");
  EXPECT_EQ(arg("grpo", "", 0.1).argument(), "overrides.");
  EXPECT_EQ(caught([] { rg::get_override(reco::presets::dapo{}, "kl.beta"); }).argument(), "overrides.kl.beta");
  // A key given twice is rejected rather than one value silently winning.
  EXPECT_EQ(caught([] {
              reco::presets::grpo g;
              rg::apply_overrides(g, rg::override_list{{"kl.beta", 0.1}, {"kl.beta", 0.2}});
            }).argument(),
            "overrides.kl.beta");
  // The objective's own range checks run after the overrides.
  const reco::error range = arg("grpo", "clip.dual_clip_c", 0.5);
  EXPECT_EQ(range.argument(), "clip.params.dual_clip_c");
  // The peers' switches (docs/peers.md) are checked the same way.
  EXPECT_EQ(arg("grpo", "clip.delta", -1).argument(), "clip.params.delta");
  EXPECT_EQ(arg("grpo", "kl.importance_weighted", 2).argument(), "overrides.kl.importance_weighted");
  EXPECT_EQ(arg("trl_vespo", "ratio.k_neg", -3).argument(), "ratio.params.k_neg");
  EXPECT_EQ(arg("trl_vespo", "clip.eps_low", 0.1).argument(), "overrides.clip.eps_low");
  // DPPO's parameters.
  EXPECT_EQ(arg("dppo", "ratio.divergence", 2).argument(), "overrides.ratio.divergence");
  EXPECT_TRUE(contains(arg("dppo", "ratio.divergence", 2).what(), "0 (tv), 1 (binary_kl)"));
  EXPECT_EQ(arg("dppo", "ratio.truncation", 0).argument(), "ratio.params.truncation");
  EXPECT_EQ(arg("dppo", "ratio.truncation", HUGE_VAL).argument(), "ratio.params.truncation");
  EXPECT_EQ(arg("dppo", "ratio.eps_low", -0.1).argument(), "ratio.params.eps_low");
  EXPECT_EQ(arg("dppo", "ratio.eps_high", std::numeric_limits<double>::quiet_NaN()).argument(),
            "overrides.ratio.eps_high");  // a NaN value never reaches the component
  EXPECT_EQ(arg("verl_dppo_kl", "clip.eps_low", 0.1).argument(), "overrides.clip.eps_low");
}

TEST(Registry, PeerSwitchesAndTrlPresetsHaveKeys) {
  reco::presets::grpo g;
  rg::apply_overrides(g, rg::override_list{{"clip.delta", 1.5}, {"kl.importance_weighted", 1}});
  EXPECT_EQ(g.clip.params.delta, 1.5);
  EXPECT_TRUE(g.kl.params.importance_weighted);
  const std::vector<std::string> vespo_keys = {"advantage.eps",    "advantage.scale_by_std", "advantage.singleton",
                                               "ratio.k_pos",      "ratio.lambda_pos",       "ratio.k_neg",
                                               "ratio.lambda_neg"};
  EXPECT_EQ(rg::preset_override_keys("trl_vespo"), vespo_keys);
  reco::presets::trl_vespo v;
  rg::set_override(v, "ratio.lambda_neg", 0.5);
  EXPECT_EQ(v.ratio.params.lambda_neg, 0.5);
  const auto luspo_keys = rg::preset_override_keys("trl_luspo");
  EXPECT_NE(std::find(luspo_keys.begin(), luspo_keys.end(), "ratio.max_log_ratio"), luspo_keys.end());
  EXPECT_NE(std::find(luspo_keys.begin(), luspo_keys.end(), "clip.delta"), luspo_keys.end());
  static_assert(rg::has_fields_v<reco::vespo_ratio> && !rg::has_fields_v<reco::seq_mean_token_sum_all>);
}

TEST(Registry, EstimatorsByName) {
  const std::vector<std::string> names = {"grpo", "dr_grpo", "rloo", "opo", "batch_std", "gpg", "reinforce_pp",
                                          "pass_at_k"};
  EXPECT_EQ(rg::estimator_names(), names);
  static_assert(rg::estimator_reads_lengths<reco::opo_advantage>() &&
                rg::estimator_reads_lengths<reco::reinforce_pp_advantage>() &&
                !rg::estimator_reads_lengths<reco::grpo_advantage>());
  std::string seen;
  EXPECT_TRUE(rg::visit_estimator("rloo", [&](auto est) { seen = typeid(est).name(); }));
  EXPECT_EQ(seen, typeid(reco::rloo_advantage).name());
  EXPECT_FALSE(rg::visit_estimator("ppo", [&](auto) { seen = "called"; }));
  EXPECT_NE(seen, "called");
}

// The batch op's advantages against the definitions, on one group and a batch stage:
// GRPO (r - mean) / (std + eps) with the unbiased std, RLOO r - mean of the others.
TEST(Registry, EstimateAdvantagesFollowsTheDefinitions) {
  const std::vector<double> r = {1, 0, 0, 1, 1, 0.5, 2};
  const std::vector<reco::index_t> groups = {0, 4, 7}, lengths(7, 3);
  std::vector<double> a(7);
  ASSERT_EQ(reco::estimate_advantages(reco::grpo_advantage{}, reco::span<const double>(r),
                                      reco::span<const reco::index_t>(groups), reco::span<const reco::index_t>(lengths),
                                      reco::span<double>(a)),
            0u);
  for (int g = 0; g < 2; ++g) {
    const int lo = static_cast<int>(groups[g]), hi = static_cast<int>(groups[g + 1]);
    double mean = 0, ss = 0;
    for (int i = lo; i < hi; ++i) mean += r[i] / (hi - lo);
    for (int i = lo; i < hi; ++i) ss += (r[i] - mean) * (r[i] - mean);
    const double sd = std::sqrt(ss / (hi - lo - 1));
    for (int i = lo; i < hi; ++i) EXPECT_NEAR(a[i], (r[i] - mean) / (sd + 1e-6), 1e-12) << i;
  }
  reco::estimate_advantages(reco::rloo_advantage{}, reco::span<const double>(r), reco::span<const reco::index_t>(groups),
                            reco::span<const reco::index_t>(lengths), reco::span<double>(a));
  for (int g = 0; g < 2; ++g) {
    const int lo = static_cast<int>(groups[g]), hi = static_cast<int>(groups[g + 1]);
    double sum = 0;
    for (int i = lo; i < hi; ++i) sum += r[i];
    for (int i = lo; i < hi; ++i) EXPECT_NEAR(a[i], r[i] - (sum - r[i]) / (hi - lo - 1), 1e-12) << i;
  }
}

}  // namespace

namespace {

// Peer presets: a base of the table plus settings, resolved by every name lookup.
TEST(Registry, PeerPresetsResolveToTheirBaseWithTheirSettings) {
  std::vector<std::string> known = expected_names;
  for (const char* n :
       {"trl_dapo", "trl_dr_grpo", "trl_cispo", "verl_vanilla", "verl_cispo", "verl_dppo_tv", "verl_dppo_kl",
        "trl_sapo", "openrlhf_ppo"})
    known.emplace_back(n);
  EXPECT_EQ(rg::known_preset_names(), known);
  EXPECT_EQ(rg::preset_names(), expected_names) << "the typed table is unchanged";

  // Each peer's settings apply to its base and pass the objective's checks.
  for (const rg::peer_preset& p : rg::peer_preset_table) {
    EXPECT_NO_THROW(rg::with_preset(p.name, [](auto obj) { obj.validate(); })) << p.name;
    EXPECT_EQ(rg::base_preset_index(p.name), rg::preset_index(p.base)) << p.name;
    const reco::objective_needs a = rg::needs_of_preset(p.name), b = rg::needs_of_preset(p.base);
    EXPECT_EQ(a.ref_logp, b.ref_logp) << p.name;
    EXPECT_EQ(a.entropy, b.entropy) << p.name;
    EXPECT_EQ(rg::preset_override_keys(p.name), rg::preset_override_keys(p.base)) << p.name;
  }

  // The constants as the peers' sources give them.
  auto value = [](const std::string& preset, const std::string& key) {
    return rg::with_preset(preset, [&](auto obj) { return rg::get_override(obj, key); });
  };
  EXPECT_EQ(value("verl_vanilla", "clip.eps_high"), 0.2);
  EXPECT_EQ(value("verl_vanilla", "clip.dual_clip_c"), 3.0);
  EXPECT_EQ(value("verl_vanilla", "clip.dual_clip"), 1.0);  // hard
  EXPECT_EQ(value("dapo", "clip.eps_high"), 0.28) << "the base keeps its own constants";
  EXPECT_EQ(value("openrlhf_ppo", "clip.dual_clip"), 0.0);
  EXPECT_EQ(value("openrlhf_ppo", "ratio.log_ratio_clamp"), 20.0);
  EXPECT_EQ(value("openrlhf_ppo", "advantage.eps"), 1e-9);
  EXPECT_EQ(value("trl_cispo", "ratio.eps_high"), 4.0);
  EXPECT_EQ(value("trl_cispo", "advantage.eps"), 1e-4);
  EXPECT_EQ(value("verl_cispo", "ratio.eps_low"), 0.2);
  EXPECT_EQ(value("trl_dr_grpo", "ratio.log_ratio_clamp"), 0.0);
  EXPECT_EQ(value("trl_dapo", "advantage.eps"), 1e-4);
  EXPECT_EQ(value("verl_dppo_tv", "ratio.truncation"), 3.0);
  EXPECT_EQ(value("verl_dppo_kl", "ratio.divergence"), 1.0);  // binary_kl
  EXPECT_EQ(value("dppo", "ratio.truncation"), 20.0) << "the base keeps its own constants";

  // For code that runs by index: the peer's settings, then the caller's; a caller's key replaces
  // the peer's setting of that key rather than repeating it.
  const rg::resolved_preset r = rg::resolve_preset("verl_vanilla", rg::override_list{{"clip.eps_high", 0.28}});
  EXPECT_EQ(r.index, rg::preset_index("dapo"));
  const rg::override_list expected_list = {
      {"clip.eps_low", 0.2}, {"clip.dual_clip", 1.0}, {"clip.dual_clip_c", 3.0}, {"clip.eps_high", 0.28}};
  EXPECT_EQ(r.overrides, expected_list);
  EXPECT_EQ(rg::resolve_preset("dapo").overrides.size(), 0u);
  EXPECT_EQ(rg::resolve_preset("dapo").index, rg::preset_index("dapo"));
}

TEST(Registry, PeerPresetNamesInErrors) {
  const reco::error e = caught([] { rg::preset_index("verl_vanilla"); });
  EXPECT_EQ(e.argument(), "preset");
  EXPECT_TRUE(contains(e.what(), "peer preset")) << e.what();
  const reco::error u = caught([] { rg::needs_of_preset("verl_vanila"); });
  EXPECT_EQ(u.argument(), "preset");
  EXPECT_TRUE(contains(u.what(), "verl_vanilla")) << "lists the peer presets: " << u.what();
  // A caller's bad key on a peer preset is named as for any preset.
  const reco::error k = caught([] {
    rg::with_preset("verl_vanilla", [](auto obj) { rg::apply_overrides(obj, rg::override_list{{"clip.eps_hi", 0.3}}); });
  });
  EXPECT_EQ(k.argument(), "overrides.clip.eps_hi");
}

}  // namespace
