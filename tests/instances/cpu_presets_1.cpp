// Explicit instances of the presets' CPU pass (see CMakeLists.txt beside this file).
#include "reco/backend/cpu_instances.hpp"

RECO_CPU_PRESET_INSTANCE_DEFINE(cispo)
RECO_CPU_PRESET_INSTANCE_DEFINE(aspo)
RECO_CPU_PRESET_INSTANCE_DEFINE(reco)
RECO_CPU_PRESET_INSTANCE_DEFINE(trl_vespo)
RECO_CPU_PRESET_INSTANCE_DEFINE(reco_response_only)
