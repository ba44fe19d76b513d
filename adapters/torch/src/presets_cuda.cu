// The 13 presets on the CUDA backend (built when LibTorch has CUDA and RECO_ENABLE_CUDA is on).
#include "presets.hpp"

#include "reco/torch/detail/cuda_run.cuh"
#include "reco/registry.hpp"

namespace reco::torch::detail {

void run_preset_cuda(const std::string& preset, const override_map& overrides, const run_request& q) {
  registry::with_preset(preset, [&](auto obj) {
    registry::apply_overrides(obj, overrides, "preset '" + preset + "'");
    run_cuda(obj, q);
  });
}

}  // namespace reco::torch::detail
