// Objectives composed at run time: a component named for each slot, parameters set by key, one
// compiled objective for every combination.
//
//   reco::composed_objective obj = reco::compose("advantage=grpo ratio=variance clip=ppo "
//                                                "weight=expected_count kl=kl_penalty");
//   reco::registry::apply_overrides(obj, {{"clip.eps_high", 0.28}, {"weight.cap", 10.0}});
//   reco::objective_result res = obj(reco::cpu{}, batch, grads);
//
// composed_objective is a reco::objective whose slots are the selectable_* components: each holds
// every alternative of its slot with that alternative's own parameters and calls the chosen one's
// own functions, so a composition computes what the fixed composition of the same components
// computes (the tests compare them bit for bit), while the library compiles one objective
// instead of one per combination. A slot not named takes its default (below). Keys are those of
// the chosen components ("clip.eps_high" with clip=ppo; a key of a component not chosen is an
// error naming it). composed_from(fixed) gives the composition of a fixed objective or preset.
//
// Slots and kinds (the first is the default):
//   advantage  grpo dr_grpo rloo opo batch_std gpg reinforce_pp pass_at_k | given
//   ratio      token sequence variance flipped reinforce cispo sapo gmpo vespo dppo
//   clip       ppo none entropy_split            (none with a self-clipped ratio form)
//   weight     uniform expected_count caller
//   aggregate  seq_mean_token_mean token_mean seq_mean_token_sum seq_mean_token_sum_norm
//              seq_mean_token_sum_all
//   select     all top_entropy                   (the 80/20 rule)
//   kl         none kl_penalty
//   entropy    none entropy_bonus
// advantage=given is composed_objective_given: the batch carries advantages (per response or
// per token) instead of rewards. Covariance selection (clip_cov, kl_cov) is a preset only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reco/advantage/given.hpp"
#include "reco/advantage/selectable.hpp"
#include "reco/aggregate/selectable.hpp"
#include "reco/clip/selectable.hpp"
#include "reco/entropy/selectable.hpp"
#include "reco/kl/selectable.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/selectable.hpp"
#include "reco/select/selectable.hpp"
#include "reco/weight/selectable.hpp"

RECO_NAMESPACE_BEGIN

using composed_objective = objective<selectable_advantage, selectable_ratio, selectable_clip, selectable_weight,
                                     selectable_aggregate, selectable_select, selectable_kl, selectable_entropy>;
using composed_objective_given = objective<given_advantage, selectable_ratio, selectable_clip, selectable_weight,
                                           selectable_aggregate, selectable_select, selectable_kl, selectable_entropy>;

// The kinds each slot takes by name, in slot order.
struct composition_slot {
  const char* name;
  std::vector<std::string> kinds;  // kinds[0] is the default
};

namespace detail {
template <class E>
std::vector<std::string> kind_names(E) {
  std::vector<std::string> v;
  const auto labels = labels_of(E{});
  for (int k = 0; k < labels.size; ++k) v.emplace_back(labels.names[k]);
  return v;
}
}  // namespace detail

inline const std::vector<composition_slot>& composition_slots() {
  static const std::vector<composition_slot> slots = [] {
    std::vector<std::string> adv = detail::kind_names(advantage_kind{});
    adv.emplace_back("given");
    std::vector<std::string> agg = detail::kind_names(aggregation_kind{});
    std::swap(agg[0], agg[1]);  // default seq_mean_token_mean, as the fixed aggregator of grpo
    return std::vector<composition_slot>{
        {"advantage", adv},
        {"ratio", detail::kind_names(ratio_kind{})},
        {"clip", {"ppo", "none", "entropy_split"}},
        {"weight", detail::kind_names(weight_kind{})},
        {"aggregate", agg},
        {"select", {"all", "top_entropy"}},
        {"kl", {"none", "kl_penalty"}},
        {"entropy", {"none", "entropy_bonus"}},
    };
  }();
  return slots;
}

// A composition: the kind chosen for each slot, in slot order.
struct composition {
  std::vector<std::string> kinds;  // one per slot of composition_slots()

  bool given_advantages() const { return kinds[0] == "given"; }
  // The canonical spelling: every slot, "advantage=grpo ratio=token ...".
  std::string spec() const {
    std::string s;
    for (std::size_t k = 0; k < kinds.size(); ++k)
      s += (k ? " " : "") + std::string(composition_slots()[k].name) + "=" + kinds[k];
    return s;
  }
};

// Whether a name given where a preset is expected is a composition ("slot=kind ...").
inline bool is_composition(const std::string& name) { return name.find('=') != std::string::npos; }

// Parses "slot=kind" pairs separated by spaces, commas or semicolons (a leading "compose:" is
// allowed). Errors name "composition.<slot>" (unknown slot or kind, a slot given twice).
inline composition parse_composition(const std::string& text) {
  const auto& slots = composition_slots();
  composition c;
  for (const auto& s : slots) c.kinds.push_back(s.kinds[0]);
  std::vector<bool> seen(slots.size(), false);
  std::string body = text;
  if (body.compare(0, 8, "compose:") == 0) body = body.substr(8);
  std::size_t i = 0;
  while (i < body.size()) {
    while (i < body.size() && (body[i] == ' ' || body[i] == ',' || body[i] == ';' || body[i] == '\t')) ++i;
    if (i >= body.size()) break;
    std::size_t j = i;
    while (j < body.size() && body[j] != ' ' && body[j] != ',' && body[j] != ';' && body[j] != '\t') ++j;
    const std::string item = body.substr(i, j - i);
    i = j;
    const auto eq = item.find('=');
    if (eq == std::string::npos) detail::fail("composition", "'" + item + "' is not of the form slot=kind");
    const std::string slot = item.substr(0, eq), kind = item.substr(eq + 1);
    std::size_t k = 0;
    while (k < slots.size() && slot != slots[k].name) ++k;
    if (k == slots.size()) {
      std::string names;
      for (const auto& s : slots) names += (names.empty() ? "" : ", ") + std::string(s.name);
      detail::fail("composition." + slot, "is not a slot (slots: " + names + ")");
    }
    if (seen[k]) detail::fail("composition." + slot, "is given twice");
    seen[k] = true;
    bool known = false;
    std::string names;
    for (const auto& n : slots[k].kinds) {
      known = known || n == kind;
      names += (names.empty() ? "" : ", ") + n;
    }
    if (!known) detail::fail("composition." + slot, "'" + kind + "' is not a kind of this slot (kinds: " + names + ")");
    c.kinds[k] = kind;
  }
  return c;
}

namespace detail {
template <class E>
E kind_from_name(const std::string& name) {
  const auto labels = labels_of(E{});
  for (int k = 0; k < labels.size; ++k)
    if (name == labels.names[k]) return static_cast<E>(k);
  fail("composition", "unknown kind '" + name + "'");
}

template <class Obj>
void set_optional_slots(Obj& o, const composition& c) {
  o.ratio.params.kind = kind_from_name<ratio_kind>(c.kinds[1]);
  o.clip.params.kind = kind_from_name<clip_kind>(c.kinds[2]);
  o.weight.params.kind = kind_from_name<weight_kind>(c.kinds[3]);
  o.aggregate.params.kind = kind_from_name<aggregation_kind>(c.kinds[4]);
  o.select.params.on = c.kinds[5] == "top_entropy";
  o.kl.params.on = c.kinds[6] == "kl_penalty";
  o.entropy.params.on = c.kinds[7] == "entropy_bonus";
}
}  // namespace detail

// The composition's objective with every chosen component at its defaults; throws for a
// composition with advantage=given (compose_given builds that one).
inline composed_objective compose(const composition& c) {
  if (c.given_advantages())
    detail::fail("composition.advantage", "is given: the objective reads advantages (compose_given)");
  composed_objective o;
  o.advantage.params.kind = detail::kind_from_name<advantage_kind>(c.kinds[0]);
  detail::set_optional_slots(o, c);
  return o;
}
inline composed_objective_given compose_given(const composition& c) {
  if (!c.given_advantages())
    detail::fail("composition.advantage", "names estimator '" + c.kinds[0] +
                                              "', which reads rewards: use advantage=given for given advantages");
  composed_objective_given o;
  detail::set_optional_slots(o, c);
  return o;
}
inline composed_objective compose(const std::string& spec) { return compose(parse_composition(spec)); }

// The composition of a fixed objective (a preset, say): the same components with the same
// parameters, selectable. Covariance selection has no selectable form.
template <class Obj>
auto composed_from(const Obj& fixed) {
  using adv = typename Obj::advantage_type;
  constexpr bool given = std::is_same_v<adv, given_advantage>;
  std::conditional_t<given, composed_objective_given, composed_objective> o;
  if constexpr (!given) o.advantage = selectable_advantage::from(fixed.advantage);
  o.ratio = selectable_ratio::from(fixed.ratio);
  o.clip = selectable_clip::from(fixed.clip);
  o.weight = selectable_weight::from(fixed.weight);
  o.aggregate = selectable_from(fixed.aggregate);
  o.select = selectable_select::from(fixed.select);
  o.kl = selectable_kl::from(fixed.kl);
  o.entropy = selectable_entropy::from(fixed.entropy);
  return o;
}

// The composition a composed objective spells (kinds only; its parameters are read by key).
template <class Obj>
composition composition_of(const Obj& o) {
  static_assert(std::is_same_v<Obj, composed_objective> || std::is_same_v<Obj, composed_objective_given>,
                "reco::composition_of: a composed objective (composed_from(fixed) gives one)");
  composition c;
  auto label = [](auto kind) { return std::string(labels_of(kind).names[static_cast<int>(kind)]); };
  if constexpr (std::is_same_v<Obj, composed_objective>) c.kinds.push_back(label(o.advantage.params.kind));
  else c.kinds.emplace_back("given");
  c.kinds.push_back(label(o.ratio.params.kind));
  c.kinds.push_back(label(o.clip.params.kind));
  c.kinds.push_back(label(o.weight.params.kind));
  c.kinds.push_back(label(o.aggregate.params.kind));
  c.kinds.emplace_back(o.select.params.on ? "top_entropy" : "all");
  c.kinds.emplace_back(o.kl.params.on ? "kl_penalty" : "none");
  c.kinds.emplace_back(o.entropy.params.on ? "entropy_bonus" : "none");
  return c;
}

RECO_NAMESPACE_END
