// Explicit instances of the presets' CPU pass (see CMakeLists.txt beside this file).
#include "reco/backend/cpu_instances.hpp"

RECO_CPU_PRESET_INSTANCE_DEFINE(reco_token_only)
RECO_CPU_PRESET_INSTANCE_DEFINE(dapo_reco)
RECO_CPU_PRESET_INSTANCE_DEFINE(rule_80_20)
RECO_CPU_PRESET_INSTANCE_DEFINE(rule_80_20_reco)
RECO_CPU_PRESET_INSTANCE_DEFINE(kl_cov)
