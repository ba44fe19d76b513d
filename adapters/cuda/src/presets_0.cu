// Presets [0, 5) of the registry's list (reco/registry.hpp) on the fused CUDA path.
#include "library.hpp"

#include "reco/cuda_adapter/objective.cuh"
#include "reco/cuda_adapter/presets_by_name.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
namespace parts {

bool run_part0(int index, const override_list& overrides, const reco_cuda_objective_args& args,
               cudaStream_t stream, context& ctx, objective_result* device_result, const objective_result** out) {
  return visit_preset<part_bounds[0], part_bounds[1]>(index, [&](auto obj) {
    registry::apply_overrides(obj, overrides, std::string("preset '") + registry::preset_name(index) + "'");
    // Clip-Cov / KL-Cov select on the host: no fused kernels are compiled for them.
    if constexpr (is_covariance_selection_v<typename decltype(obj)::selector_type>)
      ::reco::detail::fail("preset", std::string("'") + registry::preset_name(index) + "' (covariance_selection) runs on the CPU only");
    else
      *out = run_objective_async(obj, args, stream, ctx, device_result);
  });
}

}  // namespace parts
}  // namespace cuda_adapter
RECO_NAMESPACE_END
