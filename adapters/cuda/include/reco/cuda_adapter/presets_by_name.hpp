// The presets of reco/presets.hpp by name, for the raw adapter's by-name entry points. Host code.
// The library compiles the fused kernels of the presets in a few translation units, each taking
// an index range of this list (visit_preset<Lo, Hi>), so that a parallel build splits the work.
#pragma once

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "reco/config.hpp"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/presets.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

using preset_types =
    std::tuple<presets::grpo, presets::dr_grpo, presets::dapo, presets::gspo, presets::cispo, presets::aspo,
               presets::reco, presets::reco_no_cap, presets::reco_response_only, presets::reco_token_only,
               presets::dapo_reco, presets::rule_80_20, presets::rule_80_20_reco>;
inline constexpr int preset_count = static_cast<int>(std::tuple_size_v<preset_types>);
inline constexpr const char* preset_name_table[preset_count] = {
    "grpo",          "dr_grpo",         "dapo",      "gspo",      "cispo",
    "aspo",          "reco",            "reco_no_cap", "reco_response_only", "reco_token_only",
    "dapo_reco",     "rule_80_20",      "rule_80_20_reco"};

inline std::string preset_list_text() {
  std::string s;
  for (int k = 0; k < preset_count; ++k) s += (k ? ", " : "") + std::string(preset_name_table[k]);
  return s;
}

// The index of a preset; throws reco::error naming "preset" for an unknown name.
inline int preset_index(const std::string& name) {
  for (int k = 0; k < preset_count; ++k)
    if (name == preset_name_table[k]) return k;
  ::reco::detail::fail("preset", "unknown preset '" + name + "' (known: " + preset_list_text() + ")");
}

// Calls f(preset object) for the preset at `index` if it lies in [Lo, Hi); returns whether it did.
template <int Lo, int Hi, class F>
bool visit_preset(int index, F&& f) {
  if constexpr (Lo >= Hi) {
    return false;
  } else {
    if (index == Lo) {
      f(std::tuple_element_t<Lo, preset_types>{});
      return true;
    }
    return visit_preset<Lo + 1, Hi>(index, std::forward<F>(f));
  }
}

inline objective_needs needs_of_preset(int index) {
  objective_needs n;
  visit_preset<0, preset_count>(index, [&](auto obj) { n = needs_of<decltype(obj)>(); });
  return n;
}

}  // namespace cuda_adapter
RECO_NAMESPACE_END
