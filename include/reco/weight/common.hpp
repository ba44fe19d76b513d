// Shared piece of the response weighters: how weights are normalised after the cap.
#pragma once

#include <cstdint>

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

// Normalisation runs over non-empty responses (empty ones carry weight 0 and no tokens).
enum class weight_normalisation : std::uint8_t {
  none,        // the raw (capped) weights: ReCo paper's form
  group_mean,  // rescale so that the mean weight of each group is 1
  batch_mean,  // rescale so that the mean weight over the batch passed in is 1
};
constexpr choice_labels<3> labels_of(weight_normalisation) { return {{"none", "group_mean", "batch_mean"}}; }

RECO_NAMESPACE_END
