// The 13 presets on the CPU backend, in float and double, each in the adapter's form with rewards
// and with given advantages (preset_forms.hpp). Kept apart from the LibTorch code so that this heavy instantiation sees no LibTorch
// headers.
#include "presets.hpp"

#include "preset_forms.hpp"
#include "reco/torch/detail/cpu_run.hpp"

namespace reco::torch::detail {

objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages) {
  return with_preset_form(preset, overrides, given_advantages,
                          [&](const auto& obj) { return needs_of<std::decay_t<decltype(obj)>>(); });
}

std::vector<std::string> preset_keys(const std::string& preset) {
  return with_preset_form(preset, {}, false, [](const auto& obj) { return registry::override_keys(obj); });
}

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out) {
  with_preset_form(preset, overrides, given_advantages, [&](const auto& obj) { run_cpu(obj, q, out); });
}

plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages) {
  return with_preset_form(preset, overrides, given_advantages, [&](const auto& obj) { return plan_ops_for(obj); });
}

}  // namespace reco::torch::detail
