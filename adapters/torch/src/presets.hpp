// The presets by name, compiled once into reco_torch (LibTorch-free declarations).
//
// `given_advantages`: the call passes advantages instead of rewards, so the preset runs with
// reco::given_advantage in its advantage slot (reco/given_advantages.hpp) and every other
// component unchanged. Each preset is compiled in both forms.
#pragma once

#include <map>
#include <string>

#include "reco/torch/detail/request.hpp"

namespace reco::torch::detail {

using override_map = std::map<std::string, double>;

// What the preset reads; throws reco::error for an unknown preset, an unknown override key or a
// parameter out of range (and, with given advantages, for a key of the replaced estimator).
objective_needs preset_needs(const std::string& preset, const override_map& overrides, bool given_advantages);

void run_preset_cpu(const std::string& preset, const override_map& overrides, bool given_advantages,
                    const run_request& q, objective_result& out);

// The plan steps of a preset (CPU).
plan_ops preset_plan_ops(const std::string& preset, const override_map& overrides, bool given_advantages);

// Defined only when reco_torch is built with CUDA (RECO_TORCH_WITH_CUDA).
void run_preset_cuda(const std::string& preset, const override_map& overrides, bool given_advantages,
                     const run_request& q);

}  // namespace reco::torch::detail
