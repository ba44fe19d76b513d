// The 13 presets on the CUDA backend, each in the adapter's form with rewards and with given
// advantages (preset_forms.hpp); built when LibTorch has CUDA and RECO_ENABLE_CUDA is on.
#include "presets.hpp"

#include "preset_forms.hpp"
#include "reco/torch/detail/cuda_run.cuh"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

void run_preset_cuda(const std::string& preset, const override_map& overrides, bool given_advantages,
                     const run_request& q) {
  with_preset_form<false>(preset, overrides, given_advantages, [&](const auto& obj) {
    // Clip-Cov / KL-Cov select on the host: no device kernels are compiled for them.
    if constexpr (is_covariance_selection_v<typename std::decay_t<decltype(obj)>::selector_type>)
      reco::detail::fail("preset", "'" + preset + "' (covariance_selection) runs on CPU tensors only");
    else
      run_cuda(obj, q);
  });
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
