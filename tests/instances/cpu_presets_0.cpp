// Explicit instances of the presets' CPU pass (see CMakeLists.txt beside this file).
#include "reco/backend/cpu_instances.hpp"

RECO_CPU_PRESET_INSTANCE_DEFINE(grpo)
RECO_CPU_PRESET_INSTANCE_DEFINE(dr_grpo)
RECO_CPU_PRESET_INSTANCE_DEFINE(dapo)
RECO_CPU_PRESET_INSTANCE_DEFINE(trl_luspo)
RECO_CPU_PRESET_INSTANCE_DEFINE(gspo)
RECO_CPU_PRESET_INSTANCE_DEFINE(clip_cov)
