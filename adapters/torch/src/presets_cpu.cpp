// The presets on the CPU backend, in float and double, each in the adapter's form with rewards
// and with given advantages (preset_forms.hpp). Kept apart from the LibTorch code so that this
// heavy instantiation sees no LibTorch headers. A name that is a composition goes to
// compositions_cpu.cpp, compiled in a unit of its own.
#include "presets.hpp"

#include "preset_forms.hpp"
#include "reco/torch/detail/cpu_run.hpp"

namespace reco::torch::detail {

objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages) {
  if (is_composition(preset)) return composition_needs(preset, overrides, given_advantages);
  return with_preset_form(preset, overrides, given_advantages, [&](const auto& obj) { return obj.needs(); });
}

std::vector<std::string> preset_keys(const std::string& preset) {
  if (is_composition(preset)) return composition_keys(preset);
  // A preset without a KL term lists the keys that add one.
  return with_preset_form(preset, {}, false, [&](auto obj) { return registry::override_keys(with_kl_on(obj)); });
}

std::vector<std::string> preset_choice_labels(const std::string& preset) {
  if (is_composition(preset)) return composition_choice_labels(preset);
  return with_preset_form(preset, {}, false, [&](auto obj) { return choice_labels_of(with_kl_on(obj)); });
}

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out) {
  if (is_composition(preset)) return run_composition_cpu(preset, overrides, given_advantages, q, out);
  with_preset_form(preset, overrides, given_advantages, [&](const auto& obj) { run_cpu(obj, q, out); });
}

plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages) {
  if (is_composition(preset)) return composition_plan_ops(preset, overrides, given_advantages);
  return with_preset_form(preset, overrides, given_advantages, [&](const auto& obj) { return plan_ops_for(obj); });
}

}  // namespace reco::torch::detail
