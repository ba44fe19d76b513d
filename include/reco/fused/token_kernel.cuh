// Kernel B of the fused objective: one pass over the tokens that reads every per-token input
// once, writes d loss / d logp (and d loss / d entropy) once, checks the values it reads, and
// reduces the loss parts and the token diagnostics; its last block writes the result. The
// per-token step is in token_step.hpp.
//
// Tokens are walked in tiles of token_tile (grid-stride over tiles, so any N works with a grid of
// at most a few blocks per SM). A thread owns token_items consecutive tokens of a tile: on a full
// tile with aligned arrays they arrive in one 16-byte load per array (two for double) and the
// gradients leave the same way; the last tile and misaligned arrays take the scalar path. Partial
// sums are reduced in a fixed order per grid (block_merge.cuh). Requires nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/fused/block_merge.cuh"
#include "reco/fused/partials.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/token_step.hpp"
#include "reco/batch.hpp"
#include "reco/component.hpp"
#include "reco/detail/math.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

// ---- 16-byte transfers of token_items consecutive values -------------------------------------

static_assert(token_items == 4, "the vector transfers below move four values");

__device__ inline void load4(const float* p, float (&v)[4]) {
  const float4 x = __ldcs(reinterpret_cast<const float4*>(p));
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ inline void load4(const double* p, double (&v)[4]) {
  const double2 x = __ldcs(reinterpret_cast<const double2*>(p));
  const double2 y = __ldcs(reinterpret_cast<const double2*>(p) + 1);
  v[0] = x.x, v[1] = x.y, v[2] = y.x, v[3] = y.y;
}
__device__ inline void load4(const std::uint8_t* p, std::uint8_t (&v)[4]) {
  const unsigned w = *reinterpret_cast<const unsigned*>(p);
  v[0] = static_cast<std::uint8_t>(w), v[1] = static_cast<std::uint8_t>(w >> 8);
  v[2] = static_cast<std::uint8_t>(w >> 16), v[3] = static_cast<std::uint8_t>(w >> 24);
}
__device__ inline void store4(float* p, const float (&v)[4]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
}
__device__ inline void store4(double* p, const double (&v)[4]) {
  __stcs(reinterpret_cast<double2*>(p), make_double2(v[0], v[1]));
  __stcs(reinterpret_cast<double2*>(p) + 1, make_double2(v[2], v[3]));
}

// `count` values from p (vector when `vec`), nothing when p is null.
template <class V>
__device__ inline void load_items(const V* p, bool vec, int count, V (&v)[4]) {
  if (p == nullptr) return;
  if (vec) {
    load4(p, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < count) v[k] = p[k];
}
template <class V>
__device__ inline void store_items(V* p, bool vec, int count, const V (&v)[4]) {
  if (p == nullptr) return;
  if (vec) {
    store4(p, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < count) p[k] = v[k];
}

template <class Obj, class T>
__global__ void __launch_bounds__(token_block, min_blocks_per_sm) token_kernel(const token_args<Obj, T> a) {
  const detail::batch_pointers<T>& b = a.b;
  const token_layout& L = b.layout;
  const index_t N = L.tokens;
  const aggregation_counts policy = a.s->policy, valid = a.s->valid;

  token_accumulator acc;
  response_view view;
  // Tiles run from the end of the batch: kernel A read the per-response inputs (mask, old_logp)
  // front to back, so the last of them may still be in L2 when this kernel starts.
  for (index_t walked = blockIdx.x; walked < a.tiles; walked += gridDim.x) {
    const index_t tile = a.tiles - 1 - walked;
    const index_t t0 = tile * token_tile + static_cast<index_t>(threadIdx.x) * token_items;
    if (t0 >= N) continue;
    const int count = N - t0 < token_items ? static_cast<int>(N - t0) : token_items;
    const bool vec = a.vector_loads && count == token_items;
    // Issue every load of the run first; the owner lookup below overlaps with them.
    T lp[4] = {}, old[4] = {}, ref[4] = {}, h[4] = {}, tw[4] = {};
    std::uint8_t m[4] = {1, 1, 1, 1}, kp[4] = {1, 1, 1, 1};
    load_items(b.logp + t0, vec, count, lp);
    load_items(b.old_logp ? b.old_logp + t0 : nullptr, vec, count, old);
    load_items(Obj::kl_type::active ? b.ref_logp + t0 : nullptr, vec, count, ref);
    load_items(b.entropy ? b.entropy + t0 : nullptr, vec, count, h);
    load_items(b.token_weights ? b.token_weights + t0 : nullptr, vec, count, tw);
    load_items(b.mask ? b.mask + t0 : nullptr, vec, count, m);
    load_items(a.kept ? a.kept + t0 : nullptr, vec, count, kp);

    T g[4] = {T(0), T(0), T(0), T(0)}, ge[4] = {T(0), T(0), T(0), T(0)};
#pragma unroll
    for (int k = 0; k < token_items; ++k)
      if (k < count)
        token_slot(a, policy, valid, t0 + k, lp[k], old[k], ref[k], h[k], tw[k], m[k], kp[k], view, acc, g[k], ge[k]);
    store_items(a.grad_logp + t0, vec, count, g);
    store_items(a.grad_entropy ? a.grad_entropy + t0 : nullptr, vec, count, ge);
  }

  // Block partial, last-block merge, result.
  using reduce_t = cub::BlockReduce<detail::token_partial, token_block>;
  __shared__ typename reduce_t::TempStorage temp;
  __shared__ std::uint32_t block_status;
  __shared__ bool last;
  if (threadIdx.x == 0) block_status = 0;
  __syncthreads();
  if (acc.status) atomicOr(&block_status, acc.status);  // OR: order-independent
  token_block_partial mine;
  mine.tokens = reduce_t(temp).Reduce(acc.to_partial(), detail::merge_fn<detail::token_partial>{});
  __syncthreads();
  mine.status = block_status;
  if (!publish(a.slots, mine, a.ticket, a.epoch, last)) return;

  const auto total = merge_slots<detail::token_partial, token_block>(
      a.slots, static_cast<index_t>(gridDim.x), [](const token_block_partial& p) { return p.tokens; },
      detail::merge_fn<detail::token_partial>{}, temp);
  __syncthreads();
  std::uint32_t st = 0;
  for (index_t k = threadIdx.x; k < gridDim.x; k += token_block) st |= load_from_l2(a.slots + k).status;
  if (threadIdx.x == 0) block_status = 0;
  __syncthreads();
  if (st) atomicOr(&block_status, st);
  __syncthreads();
  if (threadIdx.x != 0) return;
  finish_tokens(a, total, block_status);
  leave(a.ticket, a.epoch);
}

}  // namespace fused
RECO_NAMESPACE_END
