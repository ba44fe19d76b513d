// Device helpers of the fused kernels: fixed-order warp and block reductions, the last-block
// ticket, and the merge of every block's partial by the last block. Every reduction here has a
// fixed shape for a given grid, so the fused results are bitwise reproducible run to run.
// Requires nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include <cub/block/block_reduce.cuh>

#include "reco/fused/ticket.hpp"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

// Butterfly reductions: every lane ends with the same value (a + b == b + a exactly), and the
// pairing is fixed, so the result is deterministic.
__device__ inline double warp_sum(double v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}
__device__ inline index_t warp_sum(index_t v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}
__device__ inline index_t warp_min(index_t v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const index_t o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o < v ? o : v;
  }
  return v;
}
__device__ inline index_t warp_max(index_t v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const index_t o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o > v ? o : v;
  }
  return v;
}

// Reads a partial another block wrote, from L2 (an SM's L1 is not coherent with the others).
template <class Acc>
__device__ inline Acc load_from_l2(const Acc* p) {
  static_assert(sizeof(Acc) % sizeof(unsigned long long) == 0 && alignof(Acc) >= alignof(unsigned long long),
                "partials are read as 8-byte words");
  constexpr int words = static_cast<int>(sizeof(Acc) / sizeof(unsigned long long));
  unsigned long long w[words];
  const unsigned long long* src = reinterpret_cast<const unsigned long long*>(p);
#pragma unroll
  for (int k = 0; k < words; ++k) w[k] = __ldcg(src + k);
  Acc v;
  memcpy(&v, w, sizeof(Acc));
  return v;
}

// One more arrival at the ticket of call `epoch`; true for the block that arrives last.
// Called by one thread per block, after its partial is written and fenced.
__device__ inline bool arrive(std::uint64_t* word, std::uint64_t epoch, index_t blocks) {
  auto* w = reinterpret_cast<unsigned long long*>(word);
  unsigned long long cur = __ldcg(w);
  for (;;) {
    const unsigned long long next = ticket_next(cur, epoch);
    const unsigned long long prev = atomicCAS(w, cur, next);
    if (prev == cur) return static_cast<index_t>(ticket_count(next)) == blocks;
    cur = prev;
  }
}
// The last block leaves the word ready for a replay of the same call (a CUDA graph).
__device__ inline void leave(std::uint64_t* word, std::uint64_t epoch) {
  atomicExch(reinterpret_cast<unsigned long long*>(word), static_cast<unsigned long long>(ticket_reset(epoch)));
}

// Writes this block's partial (held by thread 0) to its slot and takes a ticket. Returns true in
// every thread of the block that arrived last; that block may then read every slot.
// `flag` is a __shared__ bool of the caller.
template <class Slot>
__device__ inline bool publish(Slot* slots, const Slot& mine, std::uint64_t* ticket, std::uint64_t epoch,
                               bool& flag) {
  if (threadIdx.x == 0) {
    slots[blockIdx.x] = mine;
    __threadfence();  // the slot is visible device-wide before the ticket says so
    flag = arrive(ticket, epoch, static_cast<index_t>(gridDim.x));
  }
  __syncthreads();
  const bool last = flag;
  if (last) __threadfence();  // acquire side: see every other block's slot
  return last;
}

// The last block's merge of every slot, in block order per thread and then a fixed block tree.
// `project` maps a slot to the value reduced. The result is valid in thread 0.
template <class Value, int BLOCK, class Slot, class Project, class Merge, class Temp>
__device__ inline Value merge_slots(const Slot* slots, index_t count, Project project, Merge merge, Temp& temp) {
  Value acc{};
  for (index_t k = threadIdx.x; k < count; k += BLOCK) acc = merge(acc, project(load_from_l2(slots + k)));
  return cub::BlockReduce<Value, BLOCK>(temp).Reduce(acc, merge);
}

}  // namespace fused
RECO_NAMESPACE_END
