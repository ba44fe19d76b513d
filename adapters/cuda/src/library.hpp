// Internal declarations of the reco_cuda_adapter library: the preset dispatch, split over three
// nvcc translation units (presets_0/1/2.cu) so that a parallel build compiles the presets' fused
// kernels concurrently, and the logits op's device entry points (logits.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/presets_by_name.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
namespace parts {

// Each runs the preset at `index` with `overrides` applied if it lies in its range, storing the
// result's device address in *out, and returns whether it did.
bool run_part0(int index, const override_list& overrides, const reco_cuda_objective_args& args,
               cudaStream_t stream, context& ctx, objective_result* device_result, const objective_result** out);
bool run_part1(int index, const override_list& overrides, const reco_cuda_objective_args& args,
               cudaStream_t stream, context& ctx, objective_result* device_result, const objective_result** out);
bool run_part2(int index, const override_list& overrides, const reco_cuda_objective_args& args,
               cudaStream_t stream, context& ctx, objective_result* device_result, const objective_result** out);

// Part k takes the presets [part_bounds[k], part_bounds[k + 1]) of the registry's list.
inline constexpr int part_bounds[4] = {0, 6, 12, 21};

// The validated logits op on the device, by dtype (logits.cu).
void logits_forward_device(const reco_cuda_logits_args& args, cudaStream_t stream);
void logits_backward_device(const reco_cuda_logits_args& args, cudaStream_t stream);
// Logp and entropy from hidden states (linear.cu): the plan's workspace bytes, and the calls.
std::int64_t linear_workspace_bytes(const reco_cuda_linear_args& args);
void linear_forward_device(const reco_cuda_linear_args& args, cudaStream_t stream);
void linear_backward_device(const reco_cuda_linear_args& args, cudaStream_t stream);

}  // namespace parts
}  // namespace cuda_adapter
RECO_NAMESPACE_END
