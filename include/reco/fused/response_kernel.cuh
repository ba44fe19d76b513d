// Kernels A and F of the fused objective (the steps are in response_step.hpp).
//
// Kernel A: one warp per group (warp-stride over groups), its lanes on consecutive tokens:
//  1. the warp scans its group's responses one after another (four loads in flight per lane);
//  2. lane 0 runs the generic group stage (advantages, weights, group-mean normalisation), or,
//     in a call of a split step, the lanes take the step plan's values for the group's responses;
//  3. the warp computes a sequence-scope ratio's log-ratio when the advantages are final here;
//  4. the lanes accumulate the generic batch / group / response partials of the group's responses.
// A group's steps depend on each other only within its warp (__syncwarp), so no block waits at
// a barrier for its slowest group, and the grid is sized by groups, not by one block per group.
// The last block merges every block's partial in block order and writes the batch scalars.
//
// Kernel F (only for batch-stage advantages or batch-mean weights): one warp per response
// applies the generic finalize step and then the sequence log-ratio if it waited for it; its last
// block writes the response partial and the aggregation counts. Requires nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/fused/block_merge.cuh"
#include "reco/fused/partials.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/response_step.hpp"
#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

template <class Obj, class T>
__device__ inline void scan_response(const response_args<Obj, T>& a, index_t i, int lane) {
  const index_t begin = a.b.layout.begin(i), end = a.b.layout.end(i);
  scan_partial p;
  if (!scan_reads_tokens(a)) {
    p = scan_without_tokens(begin, end);
  } else {
    p.first = end;
    for (index_t base = begin; base < end; base += 128) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const index_t t = base + lane + 32 * k;
        if (t < end) scan_token(a, t, p);
      }
    }
    p.n = warp_sum(p.n);
    p.first = warp_min(p.first);
    p.last = warp_max(p.last);
    if (a.old_mean) p.old_sum = warp_sum(p.old_sum);
  }
  if (lane == 0) finish_response(a, i, p);
}

template <class Obj, class T>
__device__ inline void sequence_response(const Obj& obj, const detail::batch_pointers<T>& b,
                                         const detail::response_scratch& r, index_t i, int lane) {
  const index_t begin = b.layout.begin(i), end = b.layout.end(i);
  const double advantage = r.adv[i];
  double sum = 0;
  for (index_t t = begin + lane; t < end; t += 32) sum += sequence_token(obj, b, advantage, t);
  sum = warp_sum(sum);
  if (lane == 0) finish_sequence<Obj>(r, i, sum);
}

template <class Obj, class T>
__global__ void __launch_bounds__(response_block, min_blocks_per_sm)
    response_kernel(const response_args<Obj, T> a) {
  constexpr int warps = response_block / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const index_t warp = static_cast<index_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  const index_t stride = static_cast<index_t>(gridDim.x) * warps;

  detail::batch_partial bp{};
  detail::response_partial rp{};
  detail::group_partial gp{};
  for (index_t g = warp; g < a.b.groups; g += stride) {
    index_t lo, hi;
    group_range(a.b, g, lo, hi);
    for (index_t j = lo; j < hi; ++j) scan_response(a, j, lane);
    __syncwarp();  // lengths and old means of the group are in place
    if (a.planned) {
      for (index_t j = lo + lane; j < hi; j += 32) planned_response(a, j);
    } else if (lane == 0) {
      detail::group_fn<Obj, T>{a.obj, a.b, a.r, a.group_status, a.group_zero_std}(g);
      gp = detail::group_partial::merge(gp, detail::group_partial_fn{a.group_status, a.group_zero_std}(g));
    }
    __syncwarp();  // advantages and weights of the group are in place
    if constexpr (Obj::ratio_type::scope == ratio_scope::sequence) {
      if (a.sequence_here) {
        for (index_t j = lo; j < hi; ++j) sequence_response(a.obj, a.b, a.r, j, lane);
        __syncwarp();
      }
    }
    for (index_t j = lo + lane; j < hi; j += 32) {
      bp = detail::batch_partial::merge(bp, detail::batch_partial_fn<T>{a.b, a.r, a.reads_rewards}(j));
      if (a.final_responses) rp = detail::response_partial::merge(rp, detail::response_partial_fn{a.r}(j));
    }
  }

  __shared__ union {
    typename cub::BlockReduce<detail::batch_partial, response_block>::TempStorage batch;
    typename cub::BlockReduce<detail::response_partial, response_block>::TempStorage responses;
    typename cub::BlockReduce<detail::group_partial, response_block>::TempStorage groups;
  } temp;
  __shared__ bool last;
  response_block_partial mine;
  mine.batch = cub::BlockReduce<detail::batch_partial, response_block>(temp.batch)
                   .Reduce(bp, detail::merge_fn<detail::batch_partial>{});
  __syncthreads();
  mine.responses = cub::BlockReduce<detail::response_partial, response_block>(temp.responses)
                       .Reduce(rp, detail::merge_fn<detail::response_partial>{});
  __syncthreads();
  mine.groups = cub::BlockReduce<detail::group_partial, response_block>(temp.groups)
                    .Reduce(gp, detail::merge_fn<detail::group_partial>{});
  __syncthreads();
  if (!publish(a.slots, mine, a.ticket, a.epoch, last)) return;

  // The last block.
  const index_t blocks = gridDim.x;
  const auto batch = merge_slots<detail::batch_partial, response_block>(
      a.slots, blocks, [](const response_block_partial& p) { return p.batch; },
      detail::merge_fn<detail::batch_partial>{}, temp.batch);
  __syncthreads();
  const auto responses = merge_slots<detail::response_partial, response_block>(
      a.slots, blocks, [](const response_block_partial& p) { return p.responses; },
      detail::merge_fn<detail::response_partial>{}, temp.responses);
  __syncthreads();
  const auto groups = merge_slots<detail::group_partial, response_block>(
      a.slots, blocks, [](const response_block_partial& p) { return p.groups; },
      detail::merge_fn<detail::group_partial>{}, temp.groups);
  if (threadIdx.x != 0) return;
  finish_responses(a, batch, groups, responses);
  leave(a.ticket, a.epoch);
}

template <class Obj, class T>
__global__ void __launch_bounds__(finalize_block, min_blocks_per_sm)
    finalize_kernel(const finalize_args<Obj, T> a) {
  constexpr int warps = finalize_block / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const index_t warp = static_cast<index_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  const index_t stride = static_cast<index_t>(gridDim.x) * warps;
  const index_t R = a.b.layout.responses;

  detail::response_partial rp{};
  for (index_t i = warp; i < R; i += stride) {
    if (lane == 0) detail::finalize_response_fn<Obj>{a.obj, a.r, a.s}(i);
    __syncwarp();  // the final advantage is visible to the whole warp
    if constexpr (Obj::ratio_type::scope == ratio_scope::sequence) {
      if (a.sequence_here) sequence_response(a.obj, a.b, a.r, i, lane);
    }
    if (lane == 0) rp = detail::response_partial::merge(rp, detail::response_partial_fn{a.r}(i));
  }

  using reduce_t = cub::BlockReduce<detail::response_partial, finalize_block>;
  __shared__ typename reduce_t::TempStorage temp;
  __shared__ bool last;
  finalize_block_partial mine;
  mine.responses = reduce_t(temp).Reduce(rp, detail::merge_fn<detail::response_partial>{});
  __syncthreads();
  if (!publish(a.slots, mine, a.ticket, a.epoch, last)) return;
  const auto responses = merge_slots<detail::response_partial, finalize_block>(
      a.slots, static_cast<index_t>(gridDim.x), [](const finalize_block_partial& p) { return p.responses; },
      detail::merge_fn<detail::response_partial>{}, temp);
  if (threadIdx.x != 0) return;
  finish_finalize(a, responses);
  leave(a.ticket, a.epoch);
}

}  // namespace fused
RECO_NAMESPACE_END
