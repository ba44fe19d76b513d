// The presets by name on the CPU backend: each operation goes to the part of the preset table
// that compiles the preset (presets_cpu_0.cpp, presets_cpu_1.cpp), or, for a composition, to
// compositions_cpu.cpp. Light: no preset is instantiated here.
#include "presets.hpp"

#include "preset_parts.hpp"
#include "reco/composition.hpp"
#include "reco/registry.hpp"

namespace reco::torch::detail {
namespace {
preset_call& call_presets(const std::string& preset, preset_call& c) {
  registry::base_preset_index(preset);  // an unknown name: the error lists the known ones
  if (!call_presets_part0(preset, c) && !call_presets_part1(preset, c))
    ::reco::detail::fail("preset", "'" + preset + "' is in no part of the adapter's presets");
  return c;
}
preset_call request(preset_op op, const override_map& overrides, bool given_advantages) {
  preset_call c;
  c.op = op;
  c.overrides = &overrides;
  c.given_advantages = given_advantages;
  return c;
}
}  // namespace

objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages) {
  if (is_composition(preset)) return composition_needs(preset, overrides, given_advantages);
  preset_call c = request(preset_op::needs, overrides, given_advantages);
  return call_presets(preset, c).needs;
}

std::vector<std::string> preset_keys(const std::string& preset) {
  if (is_composition(preset)) return composition_keys(preset);
  const override_map none;
  preset_call c = request(preset_op::keys, none, false);
  return call_presets(preset, c).strings;
}

std::vector<std::string> preset_choice_labels(const std::string& preset) {
  if (is_composition(preset)) return composition_choice_labels(preset);
  const override_map none;
  preset_call c = request(preset_op::choice_labels, none, false);
  return call_presets(preset, c).strings;
}

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out) {
  if (is_composition(preset)) return run_composition_cpu(preset, overrides, given_advantages, q, out);
  preset_call c = request(preset_op::run, overrides, given_advantages);
  c.request = &q;
  c.result = &out;
  call_presets(preset, c);
}

plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages) {
  if (is_composition(preset)) return composition_plan_ops(preset, overrides, given_advantages);
  preset_call c = request(preset_op::plan, overrides, given_advantages);
  return call_presets(preset, c).plan;
}

}  // namespace reco::torch::detail
