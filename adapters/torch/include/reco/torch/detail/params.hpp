// Parameter overrides by name ("clip.eps_high" -> obj.clip.params.eps_high) and the presets by
// name. LibTorch-free: the translation units that instantiate the objectives include it.
//
// A key is "<component>.<field>" with component one of advantage, ratio, clip, weight,
// aggregate, select, kl, entropy. Real fields take any double (the objective's validate()
// checks ranges afterwards); flags take 0 or 1; enumerations take the index of their label
// (e.g. "clip.dual_clip": 0 off, 1 hard, 2 soft).
#pragma once

#include <cmath>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "reco/presets.hpp"
#include "reco/weight/caller_weight.hpp"

namespace reco::torch::detail {

// ---- the fields each component exposes -----------------------------------------------------

// Catch-all for components without overridable fields. A user-defined conversion ranks below
// the derived-to-base conversion, so dr_grpo_advantage still finds grpo_advantage's fields.
struct any_component {
  template <class C>
  any_component(const C&) {}
};
template <class V>
void visit_fields(any_component, V&&) {}

template <class V>
void visit_fields(grpo_advantage& c, V&& v) {
  v("eps", c.params.eps);
  v("scale_by_std", c.params.scale_by_std);
  v("singleton", c.params.singleton, {"zero", "raw_score", "error"});
}
template <class V>
void visit_fields(token_ratio& c, V&& v) {
  v("log_ratio_clamp", c.params.log_ratio_clamp);
}
template <class V>
void visit_fields(variance_ratio& c, V&& v) {
  v("variance_floor", c.params.variance_floor);
  v("log_ratio_clamp", c.params.log_ratio_clamp);
}
template <class V>
void visit_fields(sequence_ratio& c, V&& v) {
  v("max_log_ratio", c.params.max_log_ratio);
}
template <class V>
void visit_fields(cispo_ratio& c, V&& v) {
  v("eps_low", c.params.eps_low);
  v("eps_high", c.params.eps_high);
  v("log_ratio_clamp", c.params.log_ratio_clamp);
}
template <class V>
void visit_fields(flipped_ratio& c, V&& v) {
  v("flip_all", c.params.flip_all);
  v("log_ratio_clamp", c.params.log_ratio_clamp);
}
template <class V>
void visit_fields(ppo_clip& c, V&& v) {
  v("eps_low", c.params.eps_low);
  v("eps_high", c.params.eps_high);
  v("dual_clip", c.params.dual_clip, {"off", "hard", "soft"});
  v("dual_clip_c", c.params.dual_clip_c);
}
template <class V>
void visit_fields(expected_count_weight& c, V&& v) {
  v("cap", c.params.cap);
  v("normalise", c.params.normalise, {"none", "group_mean", "batch_mean"});
}
template <class V>
void visit_fields(caller_weight& c, V&& v) {
  v("cap", c.params.cap);
  v("normalise", c.params.normalise, {"none", "group_mean", "batch_mean"});
}
template <class V>
void visit_fields(seq_mean_token_sum_norm& c, V&& v) {
  v("constant", c.params.constant);
  v("max_length", c.params.max_length);
}
template <class V>
void visit_fields(top_entropy_selection& c, V&& v) {
  v("rho", c.params.rho);
  v("rule", c.params.rule, {"top_k", "quantile"});
  v("denominator", c.params.denominator, {"valid", "kept"});
}
template <class V>
void visit_fields(kl_penalty& c, V&& v) {
  v("beta", c.params.beta);
  v("estimator", c.params.estimator, {"k1", "abs", "k2", "k3"});
  v("clamp", c.params.clamp);
  v("straight_through", c.params.straight_through);
}
template <class V>
void visit_fields(entropy_bonus& c, V&& v) {
  v("coef", c.params.coef);
}

// Calls f(prefix, component) for each component of an objective.
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

inline std::string describe_labels(std::initializer_list<const char*> labels) {
  std::string s;
  int k = 0;
  for (const char* l : labels) {
    s += (k ? ", " : "") + std::to_string(k) + " (" + l + ")";
    ++k;
  }
  return s;
}

// Sets the field named `field` of one component if it exists; `found` reports whether it did.
struct field_setter {
  const std::string& field;
  const std::string& key;
  double value;
  bool found = false;

  void operator()(const char* name, double& dst) {
    if (field != name) return;
    found = true;
    dst = value;
  }
  void operator()(const char* name, bool& dst) {
    if (field != name) return;
    found = true;
    if (value != 0.0 && value != 1.0) reco::detail::fail("overrides." + key, "is a flag: use 0 or 1");
    dst = value != 0.0;
  }
  template <class E>
  void operator()(const char* name, E& dst, std::initializer_list<const char*> labels) {
    if (field != name) return;
    found = true;
    const double n = static_cast<double>(labels.size());
    if (!(value >= 0 && value < n) || value != std::floor(value))
      reco::detail::fail("overrides." + key, "is a choice: use " + describe_labels(labels));
    dst = static_cast<E>(static_cast<int>(value));
  }
};

struct field_lister {
  std::string prefix;
  std::vector<std::string>* out;
  template <class F>
  void operator()(const char* name, F&) {
    out->push_back(prefix + "." + name);
  }
  template <class E>
  void operator()(const char* name, E&, std::initializer_list<const char*>) {
    out->push_back(prefix + "." + name);
  }
};

// Every override key an objective accepts, in component order.
template <class Obj>
std::vector<std::string> parameter_keys(Obj obj) {
  std::vector<std::string> keys;
  for_each_component(obj, [&](const char* prefix, auto& c) { visit_fields(c, field_lister{prefix, &keys}); });
  return keys;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + v[k];
  return s;
}

// Applies the overrides; throws reco::error naming an unknown key or one the objective lacks,
// then runs the objective's own parameter checks.
template <class Obj>
void apply_overrides(Obj& obj, const std::map<std::string, double>& overrides, const std::string& what) {
  for (const auto& entry : overrides) {
    const std::string& key = entry.first;  // (named copies: lambdas may not capture bindings in C++17)
    const double value = entry.second;
    const auto dot = key.find('.');
    const std::string component = dot == std::string::npos ? key : key.substr(0, dot);
    const std::string field = dot == std::string::npos ? std::string() : key.substr(dot + 1);
    bool known_component = false, found = false;
    for_each_component(obj, [&](const char* prefix, auto& c) {
      if (component != prefix) return;
      known_component = true;
      field_setter s{field, key, value};
      visit_fields(c, s);
      found = s.found;
    });
    if (!found) {
      const std::vector<std::string> keys = parameter_keys(obj);
      reco::detail::fail("overrides." + key,
                         std::string(known_component ? "is not a parameter of " : "is not a known key for ") + what +
                             " (its keys: " + (keys.empty() ? std::string("none") : join(keys)) + ")");
    }
  }
  obj.validate();
}

// ---- presets by name ------------------------------------------------------------------------

inline const std::vector<std::string>& preset_list() {
  static const std::vector<std::string> names = {
      "grpo",           "dr_grpo",         "dapo",      "gspo",       "cispo",
      "aspo",           "reco",            "reco_no_cap", "reco_response_only", "reco_token_only",
      "dapo_reco",      "rule_80_20",      "rule_80_20_reco"};
  return names;
}

// Calls f(preset object) for the preset called `name`; throws reco::error naming `preset`.
template <class F>
decltype(auto) with_preset(const std::string& name, F&& f) {
  namespace p = reco::presets;
  if (name == "grpo") return f(p::grpo{});
  if (name == "dr_grpo") return f(p::dr_grpo{});
  if (name == "dapo") return f(p::dapo{});
  if (name == "gspo") return f(p::gspo{});
  if (name == "cispo") return f(p::cispo{});
  if (name == "aspo") return f(p::aspo{});
  if (name == "reco") return f(p::reco{});
  if (name == "reco_no_cap") return f(p::reco_no_cap{});
  if (name == "reco_response_only") return f(p::reco_response_only{});
  if (name == "reco_token_only") return f(p::reco_token_only{});
  if (name == "dapo_reco") return f(p::dapo_reco{});
  if (name == "rule_80_20") return f(p::rule_80_20{});
  if (name == "rule_80_20_reco") return f(p::rule_80_20_reco{});
  reco::detail::fail("preset", "unknown preset '" + name + "' (known: " + join(preset_list()) + ")");
}

}  // namespace reco::torch::detail
