// The plan steps of the presets' CUDA form (preset_forms.hpp with OnCpu = false: the objective type
// a CUDA call runs, whose fingerprint the plan must carry). Host code: a split step's plan is made
// on the host, from host copies of what it reads, for calls that then run on the device. Compiled
// by the host compiler (not nvcc) when reco_torch runs CUDA tensors.
#include "preset_forms.hpp"
#include "presets.hpp"
#include "reco/torch/detail/plan_ops.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

plan_ops preset_plan_ops_cuda(const std::string& preset, const override_map& overrides, bool given_advantages) {
  plan_ops ops;
  with_preset_form<false>(preset, overrides, given_advantages, [&](const auto& obj) {
    if constexpr (is_covariance_selection_v<typename std::decay_t<decltype(obj)>::selector_type>)
      reco::detail::fail("preset", "'" + preset + "' (covariance_selection) runs on CPU tensors only");
    else
      ops = plan_ops_for(obj);
  });
  return ops;
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
