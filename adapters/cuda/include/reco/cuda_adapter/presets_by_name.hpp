// The presets by name for the raw adapter: the core registry's list (reco/registry.hpp), brought
// into reco::cuda_adapter. Host code. The library compiles the fused kernels of the presets in a
// few translation units, each taking an index range of that list (visit_preset<Lo, Hi>), so
// that a parallel build splits the work.
#pragma once

#include "reco/config.hpp"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/registry.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

using registry::needs_of_preset;
using registry::override_list;
using registry::preset_count;
using registry::preset_index;
using registry::visit_preset;

}  // namespace cuda_adapter
RECO_NAMESPACE_END
