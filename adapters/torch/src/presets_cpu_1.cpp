// The presets of the table's second part on the CPU backend (preset_parts.hpp). LibTorch-free.
#include "preset_part.hpp"

namespace reco::torch::detail {
bool call_presets_part1(const std::string& preset, preset_call& c) {
  return call_presets_in<preset_part_split, registry::preset_count>(preset, c);
}
}  // namespace reco::torch::detail
