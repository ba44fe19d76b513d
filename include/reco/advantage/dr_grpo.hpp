// Dr.GRPO's advantage: GRPO without the std division, A_i = s_i - mean_g.
#pragma once

#include "reco/advantage/grpo.hpp"

RECO_NAMESPACE_BEGIN

struct dr_grpo_advantage : grpo_advantage {
  dr_grpo_advantage() { params.scale_by_std = false; }
};

RECO_NAMESPACE_END
