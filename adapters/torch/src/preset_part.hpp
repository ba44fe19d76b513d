// The body of a part of the presets on the CPU backend (preset_parts.hpp): the presets of the
// index range [Lo, Hi) in the adapter's form, with rewards and with given advantages.
#pragma once

#include "preset_forms.hpp"
#include "preset_parts.hpp"
#include "reco/torch/detail/cpu_run.hpp"

namespace reco::torch::detail {

template <int Lo, int Hi>
bool call_presets_in(const std::string& preset, preset_call& c) {
  const int index = registry::base_preset_index(preset);
  if (index < Lo || index >= Hi) return false;
  registry::visit_preset<Lo, Hi>(index, [&](auto obj) {
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
  return true;
}

}  // namespace reco::torch::detail
