// One registry for both adapters: the presets by name, and parameters set by key.
//
// Presets. preset_table below is the only list of (name, type); the name list, lookup by name,
// the compile-time visit over an index range (visit_preset<Lo, Hi>: a library may compile the
// presets in several translation units, each taking a range) and what each preset reads all
// come from it. Adding a preset: define it in reco/presets.hpp and add one line here.
//
// Keys. A key is "<component>.<field>": the component is the objective's member (advantage,
// ratio, clip, weight, aggregate, select, kl, entropy) and the fields are those the component
// declares beside its parameters:
//   template <class V>
//   static void fields(params_type& p, V&& v) { v("eps_low", p.eps_low); v("dual_clip", p.dual_clip); }
// A double takes any value but NaN (the objective's validate() checks ranges afterwards); a
// bool is a flag and takes 0 or 1; an enumeration takes the index of its label (labels_of(E),
// declared beside the enumeration; reco/component.hpp). Errors name "overrides.<key>".
//
// Plain C++17: no LibTorch, no CUDA.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "reco/advantage/batch_std.hpp"
#include "reco/advantage/gpg.hpp"
#include "reco/advantage/opo.hpp"
#include "reco/advantage/pass_at_k.hpp"
#include "reco/advantage/reinforce_pp.hpp"
#include "reco/advantage/rloo.hpp"
#include "reco/config.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/objective_needs.hpp"
#include "reco/presets.hpp"

RECO_NAMESPACE_BEGIN
namespace registry {

// ---- presets ---------------------------------------------------------------------------------

template <class T>
struct preset_entry {
  using type = T;
  const char* name;
};

// The presets, in the order of their indices (the C interface's reco_cuda_preset_name(k)).
inline constexpr auto preset_table = std::make_tuple(
    preset_entry<presets::grpo>{"grpo"},
    preset_entry<presets::dr_grpo>{"dr_grpo"},
    preset_entry<presets::dapo>{"dapo"},
    preset_entry<presets::gspo>{"gspo"},
    preset_entry<presets::cispo>{"cispo"},
    preset_entry<presets::aspo>{"aspo"},
    preset_entry<presets::reco>{"reco"},
    preset_entry<presets::reco_no_cap>{"reco_no_cap"},
    preset_entry<presets::reco_response_only>{"reco_response_only"},
    preset_entry<presets::reco_token_only>{"reco_token_only"},
    preset_entry<presets::dapo_reco>{"dapo_reco"},
    preset_entry<presets::rule_80_20>{"rule_80_20"},
    preset_entry<presets::rule_80_20_reco>{"rule_80_20_reco"},
    preset_entry<presets::trl_bnpo>{"trl_bnpo"},
    preset_entry<presets::trl_luspo>{"trl_luspo"},
    preset_entry<presets::trl_vespo>{"trl_vespo"},
    preset_entry<presets::gpg>{"gpg"},
    preset_entry<presets::sapo>{"sapo"},
    preset_entry<presets::clip_cov>{"clip_cov"},
    preset_entry<presets::kl_cov>{"kl_cov"},
    preset_entry<presets::dppo>{"dppo"});

using preset_table_type = std::decay_t<decltype(preset_table)>;
inline constexpr int preset_count = static_cast<int>(std::tuple_size_v<preset_table_type>);

// The type of the preset at index I.
template <int I>
using preset_type = typename std::tuple_element_t<static_cast<std::size_t>(I), preset_table_type>::type;

namespace impl {
template <std::size_t... I>
constexpr auto name_table(std::index_sequence<I...>) {
  struct table {
    const char* names[sizeof...(I)];
  };
  return table{{std::get<I>(preset_table).name...}};
}
template <std::size_t... I>
constexpr auto needs_table(std::index_sequence<I...>) {
  struct table {
    objective_needs needs[sizeof...(I)];
  };
  return table{{needs_of<typename std::tuple_element_t<I, preset_table_type>::type>()...}};
}
constexpr bool same_text(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}
}  // namespace impl

// preset_names_table.names[k]: the name of preset k, a string literal.
inline constexpr auto preset_names_table = impl::name_table(std::make_index_sequence<preset_count>{});
inline constexpr auto preset_needs_table = impl::needs_table(std::make_index_sequence<preset_count>{});

namespace impl {
constexpr bool names_unique() {
  for (int i = 0; i < preset_count; ++i)
    for (int j = i + 1; j < preset_count; ++j)
      if (same_text(preset_names_table.names[i], preset_names_table.names[j])) return false;
  return true;
}
}  // namespace impl
static_assert(impl::names_unique(), "reco::registry::preset_table: two presets share a name");

// The name of preset `index` (nullptr outside [0, preset_count)).
inline const char* preset_name(int index) {
  return index >= 0 && index < preset_count ? preset_names_table.names[index] : nullptr;
}

inline const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names(preset_names_table.names, preset_names_table.names + preset_count);
  return names;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + v[k];
  return s;
}

// ---- peer presets ----------------------------------------------------------------------------
//
// A peer's default configuration that a preset of the table above computes with other constants:
// its name, the preset it runs (its base), where the constants come from, and the settings —
// keys exactly as overrides take them — applied to the base before the caller's overrides (a
// caller's override of the same key replaces the peer's setting). A peer preset has no type of
// its own, so nothing more is compiled for it; it runs wherever its base runs. docs/peers.md
// lists them with the peers' source files.
struct preset_setting {
  const char* key = nullptr;  // nullptr ends the list
  double value = 0;
};

struct peer_preset {
  const char* name;
  const char* base;
  const char* source;
  preset_setting settings[6];
};

inline constexpr peer_preset peer_preset_table[] = {
    // TRL GRPOConfig: loss_type "dapo" (its default) is bnpo's loss with the step's token count as
    // the normaliser (num_items_in_batch: pass it in reco::normalisers.tokens).
    {"trl_dapo", "trl_bnpo", "TRL grpo_config.py: loss_type='dapo' (default), beta 0, epsilon 0.2", {}},
    // loss_type "dr_grpo" with scale_rewards "none" (Dr.GRPO's own setting); no log-ratio clamp.
    {"trl_dr_grpo", "dr_grpo", "TRL grpo_config.py: loss_type='dr_grpo', scale_rewards='none', epsilon 0.2",
     {{"ratio.log_ratio_clamp", 0.0}}},
    // loss_type "cispo": r capped at epsilon_high = 5 (the value TRL's docs recommend, ScaleRL),
    // no lower bound, std + 1e-4, no clamp.
    {"trl_cispo", "cispo", "TRL grpo_config.py: loss_type='cispo', epsilon_high 5.0 (recommended)",
     {{"advantage.eps", 1e-4}, {"ratio.eps_low", 1.0}, {"ratio.eps_high", 4.0}, {"ratio.log_ratio_clamp", 0.0}}},
    // verl's actor defaults: loss_mode "vanilla", clip_ratio_low/high 0.2, clip_ratio_c 3 (dual
    // clip), loss_agg_mode "token-mean", log-ratio clamp 20, no KL loss (use_kl_loss false).
    {"verl_vanilla", "dapo", "verl workers/config/actor.py (ActorConfig) and core_algos.py compute_policy_loss_vanilla",
     {{"clip.eps_low", 0.2}, {"clip.eps_high", 0.2}, {"clip.dual_clip", 1.0}, {"clip.dual_clip_c", 3.0}}},
    // verl's loss_mode "cispo": the detached ratio clipped to [1 - clip_ratio_low, 1 + clip_ratio_high].
    {"verl_cispo", "cispo", "verl core_algos.py compute_policy_loss_cispo with ActorConfig's clip_ratio_low/high 0.2",
     {{"ratio.eps_low", 0.2}, {"ratio.eps_high", 0.2}}},
    // verl's loss_modes "dppo_tv" / "dppo_kl" at ActorConfig's clip_ratio_low/high 0.2 (the
    // divergence bounds) and clip_ratio_c 3 (the truncation), token-mean.
    {"verl_dppo_tv", "dppo", "verl core_algos.py compute_policy_loss_dppo_tv with ActorConfig's defaults",
     {{"ratio.divergence", 0.0}, {"ratio.eps_low", 0.2}, {"ratio.eps_high", 0.2}, {"ratio.truncation", 3.0}}},
    {"verl_dppo_kl", "dppo", "verl core_algos.py compute_policy_loss_dppo_kl with ActorConfig's defaults",
     {{"ratio.divergence", 1.0}, {"ratio.eps_low", 0.2}, {"ratio.eps_high", 0.2}, {"ratio.truncation", 3.0}}},
    // TRL's loss_type "sapo": SAPO's gate at sapo_temperature_pos/neg 1 / 1.05, std + 1e-4, no clamp.
    {"trl_sapo", "sapo", "TRL grpo_config.py: loss_type='sapo', sapo_temperature_pos/neg 1.0 / 1.05",
     {{"advantage.eps", 1e-4}, {"ratio.log_ratio_clamp", 0.0}}},
    // OpenRLHF PolicyLoss defaults (0.11): clip_eps_low/high 0.2, no dual clip, token_level_loss
    // true (token mean), log-ratio clamp +-20 (dapo's); group_norm advantages over std + 1e-9.
    {"openrlhf_ppo", "dapo", "OpenRLHF openrlhf/models/loss.py PolicyLoss defaults; group_norm eps 1e-9",
     {{"advantage.eps", 1e-9},
      {"clip.eps_low", 0.2},
      {"clip.eps_high", 0.2},
      {"clip.dual_clip", 0.0}}},
};

inline constexpr int peer_preset_count = static_cast<int>(sizeof(peer_preset_table) / sizeof(peer_preset_table[0]));

namespace impl {
constexpr bool in_preset_table(const char* name) {
  for (int k = 0; k < preset_count; ++k)
    if (same_text(name, preset_names_table.names[k])) return true;
  return false;
}
constexpr bool peer_presets_well_formed() {
  for (int i = 0; i < peer_preset_count; ++i) {
    if (in_preset_table(peer_preset_table[i].name) || !in_preset_table(peer_preset_table[i].base)) return false;
    for (int j = i + 1; j < peer_preset_count; ++j)
      if (same_text(peer_preset_table[i].name, peer_preset_table[j].name)) return false;
  }
  return true;
}
}  // namespace impl
static_assert(impl::peer_presets_well_formed(),
              "reco::registry::peer_preset_table: a name repeats or shadows a preset, or a base is not a preset");

// The peer preset called `name`, or nullptr.
inline const peer_preset* find_peer_preset(const std::string& name) {
  for (const peer_preset& p : peer_preset_table)
    if (name == p.name) return &p;
  return nullptr;
}

// Every name a caller may give: the presets, then the peer presets.
inline const std::vector<std::string>& known_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = preset_names();
    for (const peer_preset& p : peer_preset_table) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

// The index of a preset of the table; throws reco::error naming "preset" (and listing the known
// names). A peer preset has no index of its own: resolve_preset gives its base and settings.
inline int preset_index(const std::string& name) {
  for (int k = 0; k < preset_count; ++k)
    if (name == preset_names_table.names[k]) return k;
  if (const peer_preset* p = find_peer_preset(name))
    ::reco::detail::fail("preset", "'" + name + "' is a peer preset of '" + p->base +
                                       "' with its own constants: resolve it with registry::resolve_preset");
  ::reco::detail::fail("preset", "unknown preset '" + name + "' (known: " + join(known_preset_names()) + ")");
}

// The preset of the table that `name` runs: itself, or a peer preset's base.
inline int base_preset_index(const std::string& name) {
  if (const peer_preset* p = find_peer_preset(name)) return preset_index(p->base);
  return preset_index(name);
}

// Calls f(preset object) for the preset at `index` if it lies in [Lo, Hi); returns whether it
// did. Only the presets of the range are instantiated.
template <int Lo, int Hi, class F>
bool visit_preset(int index, F&& f) {
  static_assert(0 <= Lo && Hi <= preset_count, "visit_preset: range outside the preset table");
  if constexpr (Lo >= Hi) {
    return false;
  } else {
    if (index == Lo) {
      f(preset_type<Lo>{});
      return true;
    }
    return visit_preset<Lo + 1, Hi>(index, std::forward<F>(f));
  }
}

namespace impl {
template <int I, class F>
decltype(auto) with_preset_at(int index, F& f) {
  if constexpr (I + 1 == preset_count) {
    return f(preset_type<I>{});
  } else {
    if (index == I) return f(preset_type<I>{});
    return with_preset_at<I + 1>(index, f);
  }
}
}  // namespace impl

// What preset `index` reads and writes (a table computed at compile time).
inline objective_needs needs_of_preset(int index) {
  ::reco::detail::require(index >= 0 && index < preset_count, "preset",
                          "index " + std::to_string(index) + " outside [0, " + std::to_string(preset_count) + ")");
  return preset_needs_table.needs[index];
}
// A peer preset reads what its base reads (its settings change constants, not the components).
inline objective_needs needs_of_preset(const std::string& name) { return needs_of_preset(base_preset_index(name)); }

// ---- advantage estimators ---------------------------------------------------------------------

// The estimators by name (the batch op reco.advantages and anything else that names one), and
// whether each reads the responses' valid-token counts.
template <class T>
struct estimator_entry {
  using type = T;
  const char* name;
  bool reads_lengths;
};

inline constexpr auto estimator_table = std::make_tuple(
    estimator_entry<grpo_advantage>{"grpo", false},
    estimator_entry<dr_grpo_advantage>{"dr_grpo", false},
    estimator_entry<rloo_advantage>{"rloo", false},
    estimator_entry<opo_advantage>{"opo", true},
    estimator_entry<batch_std_advantage>{"batch_std", false},
    estimator_entry<gpg_advantage>{"gpg", false},
    estimator_entry<reinforce_pp_advantage>{"reinforce_pp", true},
    estimator_entry<pass_at_k_advantage>{"pass_at_k", false});

inline const std::vector<std::string>& estimator_names() {
  static const std::vector<std::string> names = std::apply(
      [](const auto&... e) { return std::vector<std::string>{e.name...}; }, estimator_table);
  return names;
}

// Whether estimator Est reads the valid-token counts (false for a type not in the table).
template <class Est>
constexpr bool estimator_reads_lengths() {
  return std::apply(
      [](const auto&... e) {
        return ((std::is_same_v<typename std::decay_t<decltype(e)>::type, Est> && e.reads_lengths) || ...);
      },
      estimator_table);
}

// Calls f(estimator object) for the estimator called `name`; returns false (and calls nothing)
// for an unknown name.
template <class F>
bool visit_estimator(const std::string& name, F&& f) {
  return std::apply(
      [&](const auto&... e) {
        bool found = false;
        ((!found && name == e.name ? (f(typename std::decay_t<decltype(e)>::type{}), found = true) : false), ...);
        return found;
      },
      estimator_table);
}

// ---- fields and keys -------------------------------------------------------------------------

// Calls f(component key, component) for each component of an objective.
template <class Obj, class F>
void for_each_component(Obj& obj, F&& f) {
  f("advantage", obj.advantage);
  f("ratio", obj.ratio);
  f("clip", obj.clip);
  f("weight", obj.weight);
  f("aggregate", obj.aggregate);
  f("select", obj.select);
  f("kl", obj.kl);
  f("entropy", obj.entropy);
}

namespace impl {
template <class E, class = void>
struct has_labels : std::false_type {};
template <class E>
struct has_labels<E, std::void_t<decltype(labels_of(E{}))>> : std::true_type {};
}  // namespace impl

// Whether component C declares fields (components without parameters need not).
template <class C>
inline constexpr bool has_fields_v = ::reco::detail::has_field_list<C>::value;

// Calls v(name, field) for each field component c declares.
template <class C, class V>
void visit_fields(C& c, V&& v) {
  if constexpr (has_fields_v<C>) C::fields(c.params, v);
}

// What kind of value a field holds; the registry knows double, bool and enumerations.
template <class T>
constexpr void check_field_type() {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, bool> || std::is_enum_v<T>,
                "reco::registry: a field must be a double, a bool or an enumeration");
  if constexpr (std::is_enum_v<T>)
    static_assert(impl::has_labels<T>::value,
                  "reco::registry: an enumeration field needs labels_of(E) beside the enumeration "
                  "(reco/component.hpp, choice_labels)");
}

template <class E>
std::string describe_choices(E) {
  const auto labels = labels_of(E{});
  std::string s;
  for (int k = 0; k < labels.size; ++k) s += (k ? ", " : "") + std::to_string(k) + " (" + labels.names[k] + ")";
  return s;
}

enum class field_kind { real, flag, choice };

// One settable field: its key, kind and, for a choice, the labels of its indices.
struct field_info {
  std::string key;
  field_kind kind = field_kind::real;
  std::vector<std::string> labels;
};

namespace impl {

// Sets the field named `field` if the visited component has it.
struct field_setter {
  const std::string& field;
  const std::string& key;
  double value;
  bool found = false;

  template <class T>
  void operator()(const char* name, T& dst) {
    check_field_type<T>();
    if (field != name) return;
    found = true;
    if constexpr (std::is_same_v<T, double>) {
      // Ranges are the objective's to check; NaN is never a setting.
      if (std::isnan(value)) ::reco::detail::fail("overrides." + key, "is NaN");
      dst = value;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (value != 0.0 && value != 1.0) ::reco::detail::fail("overrides." + key, "is a flag: use 0 or 1");
      dst = value != 0.0;
    } else {
      const int n = labels_of(T{}).size;
      if (!(value >= 0 && value < n) || value != std::floor(value))
        ::reco::detail::fail("overrides." + key, "is a choice: use " + describe_choices(T{}));
      dst = static_cast<T>(static_cast<int>(value));
    }
  }
};

// Reads the field named `field` as a double (flags 0/1, choices their index).
struct field_getter {
  const std::string& field;
  double value = 0;
  bool found = false;

  template <class T>
  void operator()(const char* name, T& src) {
    check_field_type<T>();
    if (field != name) return;
    found = true;
    if constexpr (std::is_enum_v<T>)
      value = static_cast<double>(static_cast<int>(src));
    else
      value = static_cast<double>(src);
  }
};

struct field_lister {
  const char* prefix;
  std::vector<field_info>* out;
  template <class T>
  void operator()(const char* name, T&) {
    check_field_type<T>();
    field_info f;
    f.key = std::string(prefix) + "." + name;
    if constexpr (std::is_same_v<T, double>) {
      f.kind = field_kind::real;
    } else if constexpr (std::is_same_v<T, bool>) {
      f.kind = field_kind::flag;
    } else {
      f.kind = field_kind::choice;
      const auto labels = labels_of(T{});
      for (int k = 0; k < labels.size; ++k) f.labels.emplace_back(labels.names[k]);
    }
    out->push_back(std::move(f));
  }
};

template <class Obj>
std::vector<field_info> fields_of(Obj& obj) {
  std::vector<field_info> out;
  for_each_component(obj, [&](const char* prefix, auto& c) { visit_fields(c, field_lister{prefix, &out}); });
  return out;
}

// Runs visit(component, field) on the component the key names (visit returns whether the
// component has that field); throws reco::error naming
// "overrides.<key>" when the key names no field of this objective.
template <class Obj, class Visit>
void visit_key(Obj& obj, const std::string& key, const std::string& what, Visit&& visit) {
  const auto dot = key.find('.');
  const std::string component = dot == std::string::npos ? key : key.substr(0, dot);
  const std::string field = dot == std::string::npos ? std::string() : key.substr(dot + 1);
  bool known_component = false, found = false;
  for_each_component(obj, [&](const char* prefix, auto& c) {
    if (component != prefix) return;
    known_component = true;
    found = visit(c, field);
  });
  if (found) return;
  std::vector<std::string> keys;
  for (const field_info& f : fields_of(obj)) keys.push_back(f.key);
  ::reco::detail::fail("overrides." + key,
                       std::string(known_component ? "is not a parameter of " : "is not a known key for ") + what +
                           " (its keys: " + (keys.empty() ? std::string("none") : join(keys)) + ")");
}

}  // namespace impl

// Every field an objective accepts, in component order, with its kind.
template <class Obj>
std::vector<field_info> override_fields(Obj obj) {
  return impl::fields_of(obj);
}

// Every key an objective accepts, in component order.
template <class Obj>
std::vector<std::string> override_keys(Obj obj) {
  std::vector<std::string> keys;
  for (const field_info& f : impl::fields_of(obj)) keys.push_back(f.key);
  return keys;
}

// Sets one key; throws reco::error naming "overrides.<key>" for a key the objective lacks or a
// value its field cannot take. Does not validate the objective (apply_overrides does).
template <class Obj>
void set_override(Obj& obj, const std::string& key, double value, const std::string& what = "this objective") {
  impl::visit_key(obj, key, what, [&](auto& c, const std::string& field) {
    impl::field_setter s{field, key, value};
    visit_fields(c, s);
    return s.found;
  });
}

// The value of one key (flags as 0 or 1, choices as their index).
template <class Obj>
double get_override(Obj obj, const std::string& key, const std::string& what = "this objective") {
  double value = 0;
  impl::visit_key(obj, key, what, [&](auto& c, const std::string& field) {
    impl::field_getter g{field};
    visit_fields(c, g);
    value = g.value;
    return g.found;
  });
  return value;
}

// (key, value) pairs in the order they are applied.
using override_list = std::vector<std::pair<std::string, double>>;

// Applies overrides (any range of (key, value) pairs: a std::map, an override_list), then runs
// the objective's own parameter checks. `what` names the objective in errors ("preset 'reco'").
template <class Obj, class Overrides = override_list>
void apply_overrides(Obj& obj, const Overrides& overrides, const std::string& what = "this objective") {
  std::vector<std::string> seen;
  for (const auto& entry : overrides) {
    for (const std::string& k : seen)
      if (k == entry.first) ::reco::detail::fail("overrides." + k, "is given twice");
    seen.push_back(entry.first);
    set_override(obj, entry.first, entry.second, what);
  }
  obj.validate();
}

// ---- peer presets, resolved -------------------------------------------------------------------

// Sets a peer preset's settings on an object of its base (nothing for a preset of the table).
// The settings are the registry's own, so a bad one is a bug in the table: the tests apply
// every peer preset.
template <class Obj>
void apply_peer_settings(Obj& obj, const std::string& name) {
  const peer_preset* p = find_peer_preset(name);
  if (p == nullptr) return;
  const std::string who = "peer preset '" + name + "'";
  for (const preset_setting& s : p->settings) {
    if (s.key == nullptr) break;
    set_override(obj, s.key, s.value, who);
  }
}

// Returns f(preset object) for the preset called `name` (f returns one type for every preset):
// a peer preset's base with the peer's settings applied. Throws reco::error naming "preset" for
// an unknown name.
template <class F>
decltype(auto) with_preset(const std::string& name, F&& f) {
  const int index = base_preset_index(name);
  auto with_settings = [&](auto obj) -> decltype(auto) {
    apply_peer_settings(obj, name);
    return f(obj);
  };
  return impl::with_preset_at<0>(index, with_settings);
}

// The keys preset `name` accepts.
inline std::vector<std::string> preset_override_keys(const std::string& name) {
  return with_preset(name, [](auto obj) { return override_keys(obj); });
}

// A name made ready for code that runs presets of the table by index (the CUDA adapter): the
// index of the preset that runs, and the overrides to apply to it — a peer preset's settings
// first, then the caller's (a caller's key replaces the peer's setting of that key).
struct resolved_preset {
  int index = -1;
  override_list overrides;
};

template <class Overrides = override_list>
resolved_preset resolve_preset(const std::string& name, const Overrides& caller = {}) {
  resolved_preset r;
  r.index = base_preset_index(name);
  if (const peer_preset* p = find_peer_preset(name)) {
    for (const preset_setting& s : p->settings) {
      if (s.key == nullptr) break;
      bool replaced = false;
      for (const auto& entry : caller) replaced = replaced || entry.first == s.key;
      if (!replaced) r.overrides.emplace_back(s.key, s.value);
    }
  }
  for (const auto& entry : caller) r.overrides.emplace_back(entry.first, entry.second);
  return r;
}

}  // namespace registry
RECO_NAMESPACE_END
