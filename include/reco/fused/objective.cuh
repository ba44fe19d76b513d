// The fused CUDA objective: objective_algorithm<cuda_fused, Objective>, the fast path of every
// objective on the device. It computes what the generic passes compute (loss, gradients,
// diagnostics, status bits) with:
//
//   kernel A  per response and per group (response_kernel.cuh)            always
//   kernel F  batch-stage advantages / batch-mean weights (same header)     only when needed
//   kernel B  per token: loss, gradient, checks, diagnostics, result        always
//
// so the common presets take two launches. Two pieces need a sort and run the generic passes on
// the same stream between kernels A/F and B: the 80/20 selection cut with its kept flags (radix
// sort + scan; kept counts too under the kept denominator) and the entropy-split clip's
// per-response quantiles (segmented sort). docs/cuda.md lists the launches of every preset.
//
// Everything is stream-ordered on the backend's stream: no host synchronisation, no allocation
// once the workspace has grown to the call's size, no memset (the last-block tickets initialise
// themselves, ticket.hpp), so a call can be captured into a CUDA graph and replayed. Results are
// bitwise reproducible run to run on a device (fixed reduction order; fused_options::max_blocks
// pins it across devices). Requires nvcc.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/run_objective.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/cuda.cuh"
#include "reco/fused/call_args.hpp"
#include "reco/fused/backend.cuh"
#include "reco/fused/layout.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/response_kernel.cuh"
#include "reco/fused/ticket.hpp"
#include "reco/fused/token_kernel.cuh"
#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

// Resident blocks per SM of this instantiation's kernels on the current device, queried once
// per device (the query is host-side and allowed while a stream is being captured).
template <class Obj, class T>
device_limits limits_for_current_device() {
  static std::mutex lock;
  static std::map<int, device_limits> cache;
  int device = 0;
  detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> guard(lock);
  const auto found = cache.find(device);
  if (found != cache.end()) return found->second;
  device_limits d;
  detail::cuda_check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute");
  detail::cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.response_blocks_per_sm,
                                                                   response_kernel<Obj, T>, response_block, 0),
                     "occupancy of the response kernel");
  detail::cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.finalize_blocks_per_sm,
                                                                   finalize_kernel<Obj, T>, finalize_block, 0),
                     "occupancy of the finalize kernel");
  detail::cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.token_blocks_per_sm, token_kernel<Obj, T>,
                                                                   token_block, 0),
                     "occupancy of the token kernel");
  cache.emplace(device, d);
  return d;
}

// The launch configuration of one call on the current device (the tests and benchmarks read it
// too).
// `planned`: a call of a split step (detail::planned_stages).
template <class Objective, class T>
launch_config launch_config_for(const Objective& obj, const cuda_fused& backend, const batch_view<T>& batch, gradients<T> grads,
               bool planned = false) {
  const shape sh{batch.layout.responses, batch.logp.size(),
                 batch.group_offsets.size() > 0 ? batch.group_offsets.size() - 1 : 0};
  const stages st = planned ? detail::planned_stages(stages_of(obj)) : stages_of(obj);
  return make_launch_config(sh, st, limits_for_current_device<Objective, T>(),
                   token_pointers_of<Objective>(batch, grads), backend.options.vector_loads,
                   backend.options.max_blocks);
}

}  // namespace fused

template <class Objective>
struct objective_algorithm<cuda_fused, Objective> {
  // `step_plan`: a call of a split step, the plan's slice in host memory (objective::run with a
  // step_plan); it is copied into the call's scratch, stream-ordered.
  template <class T>
  static const objective_result* run(const Objective& obj, const cuda_fused& backend, const batch_view<T>& batch,
                                     gradients<T> grads, workspace<cuda_fused>& ws, const normalisers& norm,
                                     const detail::step_slice* step_plan = nullptr) {
    using namespace detail;
    const cuda_fused be = ws.bind(backend);
    const batch_pointers<T> b = pointers_of(batch);
    const index_t R = b.layout.responses, N = b.layout.tokens, P = b.groups;
    fused::check_coverage(b.layout, N, P);

    const fused::launch_config p = fused::launch_config_for(obj, backend, batch, grads, step_plan != nullptr);
    const fused::shape sh{R, N, P};
    fused::scratch sc;
    carver measure(nullptr);
    sc.carve(measure, sh, p);
    carver cut(ws.reserve(be, measure.used()));
    sc.carve(cut, sh, p);
    detail::step_slice on_device;
    if (step_plan != nullptr) on_device = sc.plan_slice.fill(be, *step_plan, R);
    const detail::step_slice* planned = step_plan != nullptr ? &on_device : nullptr;
    const auto args = fused::make_call_args(obj, batch, grads, sc, p, norm, fused::next_epoch(), planned);
    const cudaStream_t stream = be.stream;

    fused::response_kernel<Objective, T><<<static_cast<unsigned>(p.response_grid), fused::response_block, 0, stream>>>(
        args.response);
    cuda_check(cudaGetLastError(), "fused response kernel launch");
    if (p.finalize_grid > 0) {
      fused::finalize_kernel<Objective, T>
          <<<static_cast<unsigned>(p.finalize_grid), fused::finalize_block, 0, stream>>>(args.finalize);
      cuda_check(cudaGetLastError(), "fused finalize kernel launch");
    }

    // The pieces that need a sort: the generic passes, on the same stream and scratch.
    fused::run_sorted_stages(be, obj, batch, sc, p, norm, planned);

    fused::token_kernel<Objective, T><<<static_cast<unsigned>(p.token_grid), fused::token_block, 0, stream>>>(
        args.token);
    cuda_check(cudaGetLastError(), "fused token kernel launch");
    return sc.result;
  }
};

RECO_NAMESPACE_END
