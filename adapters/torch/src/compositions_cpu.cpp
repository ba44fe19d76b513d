// Compositions (reco/composition.hpp) on the CPU backend: the one composed objective, with
// rewards and with given advantages, in float and double -- a unit of its own so that a parallel
// build compiles it beside the presets.
#include "presets.hpp"

#include <cstdio>

#include "preset_forms.hpp"
#include "reco/torch/detail/cpu_run.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {
namespace {
bool reads_advantages(const std::string& spec) { return parse_composition(spec).given_advantages(); }
}  // namespace

objective_needs composition_needs(const std::string& spec, const override_map& overrides, bool given_advantages) {
  return with_composition_form(spec, overrides, given_advantages, [](const auto& obj) { return obj.needs(); });
}

std::vector<std::string> composition_keys(const std::string& spec) {
  return with_composition_form(spec, {}, reads_advantages(spec),
                               [](const auto& obj) { return registry::override_keys(obj); });
}

std::vector<std::string> composition_choice_labels(const std::string& spec) {
  return with_composition_form(spec, {}, reads_advantages(spec), [](const auto& obj) { return choice_labels_of(obj); });
}

void run_composition_cpu(const std::string& spec, const override_map& overrides, bool given_advantages,
                         const run_request& q, objective_result& out) {
  with_composition_form(spec, overrides, given_advantages, [&](const auto& obj) { run_cpu(obj, q, out); });
}

plan_ops composition_plan_ops(const std::string& spec, const override_map& overrides, bool given_advantages) {
  return with_composition_form(spec, overrides, given_advantages, [](const auto& obj) { return plan_ops_for(obj); });
}

std::vector<std::string> preset_as_composition(const std::string& preset) {
  return with_preset_form(preset, {}, false, [&](const auto& obj) {
    std::vector<std::string> out;
    if constexpr (is_covariance_selection_v<typename std::decay_t<decltype(obj)>::selector_type>) {
      ::reco::detail::fail("preset", "'" + preset + "' selects by covariance (clip_cov / kl_cov), which has no "
                                     "composition: run it by name");
    } else {
      const auto composed = composed_from(obj);
      out.push_back(composition_of(composed).spec());
      for (const std::string& key : registry::override_keys(composed)) {
        char value[64];
        std::snprintf(value, sizeof value, "%.17g", registry::get_override(composed, key));
        out.push_back(key + "=" + value);
      }
    }
    return out;
  });
}

std::vector<std::string> composition_slot_list() {
  std::vector<std::string> out;
  for (const composition_slot& s : reco::composition_slots()) {
    std::string e = std::string(s.name) + "=";
    for (std::size_t k = 0; k < s.kinds.size(); ++k) e += (k ? "|" : "") + s.kinds[k];
    out.push_back(e);
  }
  return out;
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
