// reco::selectable_aggregate: each kind against the independent reference on a few presets'
// other components, the preset's own kind reproducing the preset, and its parameter checks.
#include <gtest/gtest.h>

#include <string>

#include "core/compare.hpp"
#include "reco/aggregate/selectable.hpp"
#include "reco/presets.hpp"
#include "reco/registry.hpp"

namespace {

using namespace reco_test;

// A preset with its aggregation made selectable (what the LibTorch adapter runs by name).
template <class P>
auto selectable_form(const P& p) {
  reco::objective<typename P::advantage_type, typename P::ratio_type, typename P::clip_type, typename P::weight_type,
                  reco::selectable_aggregate, typename P::selector_type, typename P::kl_type,
                  typename P::entropy_type>
      o;
  o.advantage = p.advantage;
  o.ratio = p.ratio;
  o.clip = p.clip;
  o.weight = p.weight;
  o.aggregate = reco::selectable_from(p.aggregate);
  o.select = p.select;
  o.kl = p.kl;
  o.entropy = p.entropy;
  return o;
}

const reco_ref::aggregation ref_kinds[5] = {
    reco_ref::aggregation::token_mean, reco_ref::aggregation::seq_mean_token_mean,
    reco_ref::aggregation::seq_mean_token_sum, reco_ref::aggregation::seq_mean_token_sum_norm,
    reco_ref::aggregation::seq_mean_token_sum_all};

template <class P>
void check_kinds(const std::string& name, std::uint64_t seed) {
  auto obj = selectable_form(P{});
  const auto specs = standard_specs();
  for (int k = 0; k < 5; ++k) {
    // By key, as a caller selects it.
    reco::registry::set_override(obj, "aggregate.kind", k);
    EXPECT_EQ(static_cast<int>(obj.aggregate.params.kind), k);
    reco_ref::config cfg = reco_ref::preset(name);
    cfg.agg = ref_kinds[k];
    for (std::size_t b = 0; b < specs.size(); b += 5) {
      const master_batch m = make_batch(seed + b, specs[b]);
      const reco_ref::output ref = reco_ref::evaluate(to_reference(m), cfg);
      for (bool vectorise : {true, false})
        expect_matches(run_library<double>(obj, m, {}, vectorise), ref, tolerances_for<double>(),
                       name + " aggregate.kind=" + std::to_string(k) + " batch " + std::to_string(b) +
                           path_name(vectorise));
    }
  }
}

TEST(SelectableAggregate, KindsAgainstTheReference) {
  check_kinds<reco::presets::dapo>("dapo", 9100);      // token ratio, uniform weight
  check_kinds<reco::presets::reco>("reco", 9200);      // variance ratio, expected-count weight, KL
  check_kinds<reco::presets::gspo>("gspo", 9300);      // sequence ratio
  check_kinds<reco::presets::rule_80_20>("rule_80_20", 9400);  // token selection (valid denominator)
}

TEST(SelectableAggregate, OwnKindReproducesThePreset) {
  const auto specs = standard_specs();
  auto same = [&](const auto& preset, const std::string& name) {
    const auto form = selectable_form(preset);
    for (std::size_t b = 0; b < specs.size(); b += 4) {
      const master_batch m = make_batch(9500 + b, specs[b]);
      const library_output x = run_library<double>(form, m), y = run_library<double>(preset, m);
      EXPECT_EQ(x.result.loss, y.result.loss) << name << " batch " << b;
      EXPECT_EQ(x.grad_logp, y.grad_logp) << name << " batch " << b;
    }
  };
  same(reco::presets::grpo{}, "grpo");
  reco::presets::dr_grpo dr;
  dr.aggregate.params.constant = 37.0;  // the parameters come along
  same(dr, "dr_grpo");
  EXPECT_EQ(selectable_form(dr).aggregate.params.constant, 37.0);
}

TEST(SelectableAggregate, ParameterErrors) {
  auto obj = selectable_form(reco::presets::dapo{});
  auto argument = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const reco::error& e) {
      return e.argument();
    }
    return "";
  };
  // constant / max_length only for seq_mean_token_sum_norm.
  EXPECT_EQ(argument([&] { reco::registry::apply_overrides(obj, {{"aggregate.constant", 5.0}}); }),
            "aggregate.params.constant");
  EXPECT_EQ(argument([&] {
              reco::registry::apply_overrides(obj, {{"aggregate.kind", 3.0}, {"aggregate.constant", 5.0}});
            }),
            "");
  EXPECT_EQ(argument([&] { reco::registry::apply_overrides(obj, {{"aggregate.kind", 5.0}}); }),
            "overrides.aggregate.kind");
  obj.aggregate.params.kind = reco::aggregation_kind::seq_mean_token_sum_norm;
  obj.aggregate.params.max_length = -1;
  EXPECT_EQ(argument([&] { obj.validate(); }), "aggregate.params.max_length");
}

}  // namespace
