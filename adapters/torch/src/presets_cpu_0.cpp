// The presets of the table's first part on the CPU backend (preset_parts.hpp). LibTorch-free.
#include "preset_part.hpp"

namespace reco::torch::detail {
bool call_presets_part0(const std::string& preset, preset_call& c) {
  return call_presets_in<0, preset_part_split>(preset, c);
}
}  // namespace reco::torch::detail
