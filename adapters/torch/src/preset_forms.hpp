// The form in which the adapter runs a preset by name (LibTorch-free; shared by the CPU and CUDA
// instantiations): the preset's components and constants, with
//  - its aggregation as reco::selectable_aggregate, so that "aggregate.kind" selects any
//    aggregation per call (a preset's own aggregation is the default kind); and
//  - with given advantages, reco::given_advantage in the advantage slot (reco/given_advantages.hpp).
// So each preset is compiled twice (rewards, given advantages), whatever the aggregation.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "presets.hpp"
#include "reco/aggregate/selectable.hpp"
#include "reco/given_advantages.hpp"
#include "reco/registry.hpp"

namespace reco::torch::detail {

template <class A, class = void>
struct has_selectable_form : std::false_type {};
template <class A>
struct has_selectable_form<A, std::void_t<decltype(selectable_from(std::declval<const A&>()))>> : std::true_type {};

// An aggregator without a selectable form (a new one) is kept as it is.
template <class A>
using form_aggregate_t = std::conditional_t<has_selectable_form<A>::value, selectable_aggregate, A>;

template <class Advantage, class Obj>
using preset_form_t =
    objective<Advantage, typename Obj::ratio_type, typename Obj::clip_type, typename Obj::weight_type,
              form_aggregate_t<typename Obj::aggregate_type>, typename Obj::selector_type, typename Obj::kl_type,
              typename Obj::entropy_type>;

template <class Advantage, class Obj>
preset_form_t<Advantage, Obj> preset_form(const Obj& obj) {
  preset_form_t<Advantage, Obj> f;
  if constexpr (std::is_same_v<Advantage, typename Obj::advantage_type>) f.advantage = obj.advantage;
  f.ratio = obj.ratio;
  f.clip = obj.clip;
  f.weight = obj.weight;
  if constexpr (has_selectable_form<typename Obj::aggregate_type>::value)
    f.aggregate = selectable_from(obj.aggregate);
  else
    f.aggregate = obj.aggregate;
  f.select = obj.select;
  f.kl = obj.kl;
  f.entropy = obj.entropy;
  return f;
}

// Returns f(the form of preset `preset` with `overrides` applied). With given advantages the
// estimator does not run, so a key of it is an error rather than a setting silently ignored.
template <class F>
decltype(auto) with_preset_form(const std::string& preset, const override_map& overrides, bool given_advantages,
                                F&& f) {
  return registry::with_preset(preset, [&](auto obj) {
    using P = decltype(obj);
    const std::string who = "preset '" + preset + "'";
    if (given_advantages) {
      for (const auto& kv : overrides)
        if (kv.first.compare(0, 10, "advantage.") == 0)
          ::reco::detail::fail("overrides." + kv.first, "sets a parameter of " + who +
                                                            "'s advantage estimator, which does not run when "
                                                            "advantages are given");
      auto form = preset_form<given_advantage>(obj);
      registry::apply_overrides(form, overrides, who);
      return f(form);
    }
    auto form = preset_form<typename P::advantage_type>(obj);
    registry::apply_overrides(form, overrides, who);
    return f(form);
  });
}

}  // namespace reco::torch::detail
