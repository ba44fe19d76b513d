// The form in which the adapter runs a preset by name (LibTorch-free; shared by the CPU and CUDA
// instantiations): the preset's components and constants, with
//  - its aggregation as reco::selectable_aggregate, so that "aggregate.kind" selects any
//    aggregation per call (a preset's own aggregation is the default kind);
//  - on the CPU, a preset without a KL term gets reco::selectable_kl (off), so that any "kl.*"
//    key adds the KL term (kl_penalty's defaults, then the keys) -- exactly no_kl otherwise; and
//  - with given advantages, reco::given_advantage in the advantage slot (reco/given_advantages.hpp).
// So each preset is compiled twice (rewards, given advantages), whatever the aggregation.
// A name of the form "slot=kind ..." is a composition (reco/composition.hpp), run on the CPU by
// the one composed objective (twice compiled too: rewards, given advantages).
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "presets.hpp"
#include "reco/aggregate/selectable.hpp"
#include "reco/composition.hpp"
#include "reco/kl/selectable.hpp"
#include "reco/given_advantages.hpp"
#include "reco/registry.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

template <class A, class = void>
struct has_selectable_form : std::false_type {};
template <class A>
struct has_selectable_form<A, std::void_t<decltype(selectable_from(std::declval<const A&>()))>> : std::true_type {};

// An aggregator without a selectable form (a new one) is kept as it is.
template <class A>
using form_aggregate_t = std::conditional_t<has_selectable_form<A>::value, selectable_aggregate, A>;

// On the CPU a preset without a KL term takes one by key (selectable_kl, off until a key sets it).
template <class K, bool SelectableKl>
using form_kl_t = std::conditional_t<SelectableKl && std::is_same_v<K, no_kl>, selectable_kl, K>;

template <class Advantage, class Obj, bool SelectableKl>
using preset_form_t =
    objective<Advantage, typename Obj::ratio_type, typename Obj::clip_type, typename Obj::weight_type,
              form_aggregate_t<typename Obj::aggregate_type>, typename Obj::selector_type,
              form_kl_t<typename Obj::kl_type, SelectableKl>, typename Obj::entropy_type>;

template <class Advantage, bool SelectableKl, class Obj>
preset_form_t<Advantage, Obj, SelectableKl> preset_form(const Obj& obj, const override_map& overrides) {
  preset_form_t<Advantage, Obj, SelectableKl> f;
  if constexpr (std::is_same_v<Advantage, typename Obj::advantage_type>) f.advantage = obj.advantage;
  f.ratio = obj.ratio;
  f.clip = obj.clip;
  f.weight = obj.weight;
  if constexpr (has_selectable_form<typename Obj::aggregate_type>::value)
    f.aggregate = selectable_from(obj.aggregate);
  else
    f.aggregate = obj.aggregate;
  f.select = obj.select;
  if constexpr (::reco::detail::is_selectable_v<decltype(f.kl)>) {
    bool keyed = false;
    for (const auto& kv : overrides) keyed = keyed || kv.first.compare(0, 3, "kl.") == 0;
    f.kl.params.on = keyed;
  } else {
    f.kl = obj.kl;
  }
  f.entropy = obj.entropy;
  return f;
}

// The form with a selectable KL term switched on (to list the keys that add one).
template <class Obj>
Obj with_kl_on(Obj obj) {
  if constexpr (::reco::detail::is_selectable_v<typename Obj::kl_type>) obj.kl.params.on = true;
  return obj;
}

// The choice parameters of an objective: "key=label0|label1|..." (index = position).
template <class Obj>
std::vector<std::string> choice_labels_of(const Obj& obj) {
  std::vector<std::string> out;
  for (const registry::field_info& f : registry::override_fields(obj)) {
    if (f.kind != registry::field_kind::choice) continue;
    std::string e = f.key + "=";
    for (std::size_t k = 0; k < f.labels.size(); ++k) e += (k ? "|" : "") + f.labels[k];
    out.push_back(e);
  }
  return out;
}

// Returns f(the adapter's form of `obj`, preset `preset`'s object with its peer settings, with
// `overrides` applied).
template <bool OnCpu, class P, class F>
decltype(auto) with_form_of(const P& obj, const std::string& preset, const override_map& overrides,
                            bool given_advantages, F&& f) {
  const std::string who = "preset '" + preset + "'";
  if constexpr (!OnCpu && std::is_same_v<typename P::kl_type, no_kl>) {
    for (const auto& kv : overrides)
      if (kv.first.compare(0, 3, "kl.") == 0)
        ::reco::detail::fail("overrides." + kv.first, "adds a KL term to " + who +
                                                          ", which has none; a KL term added by key runs on CPU "
                                                          "tensors only");
  }
  if (given_advantages) {
    for (const auto& kv : overrides)
      if (kv.first.compare(0, 10, "advantage.") == 0)
        ::reco::detail::fail("overrides." + kv.first, "sets a parameter of " + who +
                                                          "'s advantage estimator, which does not run when "
                                                          "advantages are given");
    auto form = preset_form<given_advantage, OnCpu>(obj, overrides);
    registry::apply_overrides(form, overrides, who);
    return f(form);
  }
  auto form = preset_form<typename P::advantage_type, OnCpu>(obj, overrides);
  registry::apply_overrides(form, overrides, who);
  return f(form);
}

// Returns f(the form of preset `preset` with `overrides` applied). With given advantages the
// estimator does not run, so a key of it is an error rather than a setting silently ignored. A KL
// term added by key runs on the CPU only (OnCpu false: the CUDA instantiation, which names the
// limit in its error). Compositions are not presets: with_composition_form below.
template <bool OnCpu = true, class F>
decltype(auto) with_preset_form(const std::string& preset, const override_map& overrides, bool given_advantages,
                                F&& f) {
  if (is_composition(preset))
    ::reco::detail::fail("preset", "composition '" + preset + "' runs on CPU tensors only (CUDA tensors run the "
                                   "presets by name)");
  return registry::with_preset(preset, [&](auto obj) {
    return with_form_of<OnCpu>(obj, preset, overrides, given_advantages, f);
  });
}

// Returns f(the composed objective `spec` spells, with `overrides` applied): the rewards form,
// or with given advantages the form with advantage=given (compiled in compositions_cpu.cpp only).
template <class F>
decltype(auto) with_composition_form(const std::string& spec, const override_map& overrides, bool given_advantages,
                                     F&& f) {
  const composition c = parse_composition(spec);
  const std::string who = "composition '" + c.spec() + "'";
  if (given_advantages) {
    if (!c.given_advantages())
      ::reco::detail::fail("advantages", who + " computes its advantages from rewards (advantage=" + c.kinds[0] +
                                             "); pass rewards, or compose with advantage=given");
    auto form = compose_given(c);
    registry::apply_overrides(form, overrides, who);
    return f(form);
  }
  if (c.given_advantages())
    ::reco::detail::fail("advantages", who + " reads given advantages (advantage=given): pass advantages or "
                                             "token_advantages instead of rewards");
  auto form = compose(c);
  registry::apply_overrides(form, overrides, who);
  return f(form);
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
