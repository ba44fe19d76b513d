// The presets on the CPU backend, compiled in parts (presets_cpu_0.cpp, presets_cpu_1.cpp: each
// an index range of the registry's table) so that a parallel build compiles the heaviest code of
// the adapter in two units at once. One request type carries every operation the adapter asks of
// a preset, so each part instantiates each preset's form once for all of them.
#pragma once

#include <string>
#include <vector>

#include "presets.hpp"

namespace reco::torch::detail {

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

// Carries out `c` for preset `preset` if its index lies in the part's range; returns whether it did.
bool call_presets_part0(const std::string& preset, preset_call& c);
bool call_presets_part1(const std::string& preset, preset_call& c);

// Where the parts split the preset table.
inline constexpr int preset_part_split = 11;

}  // namespace reco::torch::detail
