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

namespace reco::torch::detail {

using override_map = std::map<std::string, double>;

// What the preset reads; throws reco::error for an unknown preset, an unknown override key or a
// parameter out of range (and, with given advantages, for a key of the replaced estimator).
objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages);

// The override keys the preset accepts in the adapter's form (with rewards).
std::vector<std::string> preset_keys(const std::string& preset);

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out);

// The plan steps of a preset (CPU).
plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages);

// Defined only when reco_torch is built with CUDA (RECO_TORCH_WITH_CUDA).
void run_preset_cuda(const std::string& preset, const override_map& overrides, bool given_advantages,
                     const run_request& q);

}  // namespace reco::torch::detail
