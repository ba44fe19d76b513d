// The 13 presets on the CPU backend, in float and double. Kept apart from the LibTorch code so
// that this heavy instantiation sees no LibTorch headers.
#include "presets.hpp"

#include "reco/torch/detail/cpu_run.hpp"
#include "reco/registry.hpp"

namespace reco::torch::detail {

objective_needs preset_needs(const std::string& preset, const override_map& overrides) {
  return registry::with_preset(preset, [&](auto obj) {
    registry::apply_overrides(obj, overrides, "preset '" + preset + "'");
    return needs_of<decltype(obj)>();
  });
}

void run_preset_cpu(const std::string& preset, const override_map& overrides, const run_request& q,
                    objective_result& out) {
  registry::with_preset(preset, [&](auto obj) {
    registry::apply_overrides(obj, overrides, "preset '" + preset + "'");
    run_cpu(obj, q, out);
  });
}

plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides) {
  return registry::with_preset(preset, [&](auto obj) {
    registry::apply_overrides(obj, overrides, "preset '" + preset + "'");
    return plan_ops_for(obj);
  });
}

}  // namespace reco::torch::detail
