// The presets by name, compiled once into reco_torch (LibTorch-free declarations).
//
// A preset runs in the adapter's form (preset_forms.hpp): its aggregation selectable by key
// ("aggregate.kind") and, with `given_advantages` (the call passes advantages instead of
// rewards), reco::given_advantage in its advantage slot, every other component unchanged.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "reco/torch/detail/request.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

using override_map = std::map<std::string, double>;

// What the preset reads; throws reco::error for an unknown preset, an unknown override key or a
// parameter out of range (and, with given advantages, for a key of the replaced estimator).
objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages);
// The same for inputs whose given advantages are per token (`per_token`): an error about the given
// advantages then names token_advantages, the argument the caller passed.
inline objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages,
                                    bool per_token) {
  try {
    return preset_needs(preset, overrides, given_advantages);
  } catch (const reco::error& e) {
    if (!per_token || e.argument() != "advantages") throw;
    throw reco::error("token_advantages", e.message());
  }
}

// The same for a composition ("slot=kind ...", reco/composition.hpp; compositions_cpu.cpp).
objective_needs composition_needs(const std::string& spec, const override_map& overrides, bool given_advantages);
std::vector<std::string> composition_keys(const std::string& spec);
std::vector<std::string> composition_choice_labels(const std::string& spec);
void run_composition_cpu(const std::string& spec, const override_map& overrides, bool given_advantages,
                         const run_request& q, objective_result& out);
plan_ops composition_plan_ops(const std::string& spec, const override_map& overrides, bool given_advantages);

// The slots of a composition and their kinds, "slot=kind1|kind2|..." (reco/composition.hpp).
std::vector<std::string> composition_slot_list();
// The preset's choice parameters, "key=label0|label1|..." (index = position).
std::vector<std::string> preset_choice_labels(const std::string& preset);
// The preset as a composition: its spec, then "key=value" for every parameter of the chosen
// components (the preset's constants).
std::vector<std::string> preset_as_composition(const std::string& preset);

// The override keys the preset accepts in the adapter's form (with rewards).
std::vector<std::string> preset_keys(const std::string& preset);

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out);

// The plan steps of a preset's CPU form.
plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages);

// Defined only when reco_torch is built with CUDA (RECO_TORCH_WITH_CUDA).
void run_preset_cuda(const std::string& preset, const override_map& overrides, bool given_advantages,
                     const run_request& q);
// The plan steps of the preset's CUDA form (the objective type its CUDA calls run), on host data.
plan_ops preset_plan_ops_cuda(const std::string& preset, const override_map& overrides, bool given_advantages);

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
