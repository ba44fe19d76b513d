// The presets by name on the CPU backend, in float and double, each in the adapter's form with
// rewards and with given advantages (preset_forms.hpp); a composition goes to compositions_cpu.cpp.
// One request type carries every operation the adapter asks of a preset, so each preset's form
// is instantiated once for all of them, in this one unit (split into parts, what the parts share
// was compiled once per part). LibTorch-free: this heavy unit sees no LibTorch headers.
#include "presets.hpp"

#include <string>
#include <vector>

#include "preset_forms.hpp"
#include "reco/composition.hpp"
#include "reco/registry.hpp"
#include "reco/torch/detail/cpu_run.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {
namespace {

enum class preset_op { needs, keys, choice_labels, run, plan };

struct preset_call {
  preset_op op = preset_op::needs;
  const override_map* overrides = nullptr;
  bool given_advantages = false;
  const run_request* request = nullptr;  // run
  objective_result* result = nullptr;    // run
  objective_needs needs;                 // needs
  std::vector<std::string> strings;      // keys, choice_labels
  plan_ops plan;                         // plan
};

// Carries out `c` for the preset named `preset` (an unknown name: the error lists the known ones).
preset_call& call_presets(const std::string& preset, preset_call& c) {
  const int index = registry::base_preset_index(preset);
  registry::visit_preset<0, registry::preset_count>(index, [&](auto obj) {
    registry::apply_peer_settings(obj, preset);
    with_form_of<true>(obj, preset, *c.overrides, c.given_advantages, [&](auto form) {
      switch (c.op) {
        case preset_op::needs: c.needs = form.needs(); break;
        // A preset without a KL term lists the keys that add one.
        case preset_op::keys: c.strings = registry::override_keys(with_kl_on(form)); break;
        case preset_op::choice_labels: c.strings = choice_labels_of(with_kl_on(form)); break;
        case preset_op::run: run_cpu(form, *c.request, *c.result); break;
        case preset_op::plan: c.plan = plan_ops_for(form); break;
      }
    });
  });
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

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
