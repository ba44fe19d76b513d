// The split-step protocol's names for where a part lies: the step every part agrees on
// (step_info) and one part's place in it (step_part). A part is a contiguous range of the step's
// responses; its local group j is group first_group + j of the step (a group may span parts).
#pragma once

#include <cstdint>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
// What every part of a step agrees on.
struct step_info {
  std::uint64_t id = 0;     // the step (a counter); a plan is only valid for its step
  index_t responses = 0;    // R of the whole step
  double scale = 1.0;       // multiplies each part's loss and gradient (W under DDP/FSDP averaging)
  std::uint64_t config = 0; // optional digest of the caller's configuration, compared across parts
};

// One part: where its responses and groups sit in the step.
struct step_part {
  step_info step{};
  index_t first_response = 0;  // the step index of the part's first response
  index_t first_group = 0;     // the step's id of the part's first group
};
RECO_NAMESPACE_END
