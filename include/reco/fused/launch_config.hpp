// The launch configuration of the fused CUDA objective: which kernels run, their grid sizes,
// whether the 16-byte vector path may be used, and how many bytes per token the launch moves.
// Pure C++ (no CUDA headers): it is a function of sizes, device limits and pointer
// values, so it is unit-tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reco/algorithm/call_stages.hpp"
#include "reco/component.hpp"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

// Block shapes of the fused kernels (compile-time: the kernels' shared memory depends on them).
inline constexpr int response_block = 256;  // kernel A: one warp per group
inline constexpr int finalize_block = 256;  // kernel F: one warp per response
inline constexpr int token_block = 256;     // kernel B: tiles of token_block * token_items tokens
inline constexpr int token_items = 4;       // consecutive tokens per thread (one 16-byte float load)
inline constexpr index_t token_tile = static_cast<index_t>(token_block) * token_items;
// Resident blocks per SM the kernels are compiled for (__launch_bounds__): 4 blocks of 256
// threads are half of sm_90's 2,048 threads per SM, so the compiler keeps each thread within 64
// registers (65,536 per SM). (A block count below it is still correct, only less occupied.)
inline constexpr int min_blocks_per_sm = 4;
inline constexpr int warps_per_finalize_block = finalize_block / 32;
inline constexpr int warps_per_response_block = response_block / 32;

// The last-block tickets keep their arrival count in 24 bits (see ticket.hpp), so no fused grid
// may have 2^24 blocks; grids are capped by residency far below that.
inline constexpr index_t max_grid = (index_t(1) << 24) - 1;

// What the device offers one instantiation of the kernels (queried once per device and cached).
struct device_limits {
  int sms = 1;                     // multiprocessors
  int response_blocks_per_sm = 1;  // resident blocks of kernel A
  int finalize_blocks_per_sm = 1;  // ... kernel F
  int token_blocks_per_sm = 1;     // ... kernel B
};

// The stages a call runs: the objective's plan (reco/algorithm/call_stages.hpp), the one
// derivation the generic algorithm reads too.
using stages = objective_stages;
using ::reco::stages_of;

// The problem as the launch configuration sees it.
struct shape {
  index_t responses = 0;
  index_t tokens = 0;
  index_t groups = 0;
};

struct launch_config {
  index_t response_grid = 1;  // kernel A blocks (always launched: it writes the batch scalars)
  index_t finalize_grid = 0;  // kernel F blocks, 0 when the stage is off
  index_t token_grid = 1;     // kernel B blocks
  index_t tiles = 0;          // token tiles of token_tile tokens
  bool vector_loads = false;  // kernel B may use 16-byte loads on full tiles
  int fused_kernels = 2;      // launches of the fused kernels themselves (A, [F], B)
  bool generic_selection = false;  // + the generic cut / kept-flag passes (radix sort + scan)
  bool generic_kept_counts = false;
  bool generic_entropy_quantile = false;  // + the generic segmented sort
  stages st{};                     // the objective's stages the configuration was made for
};

inline index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

// Blocks for `work` independent items with at most `per_sm` resident blocks per SM: enough to
// fill the device once, never more than there is work, at least one (every kernel writes its
// scalars from its last block, so it runs even for an empty batch). max_blocks > 0 caps it.
inline index_t grid_for(index_t work, int sms, int per_sm, int max_blocks) {
  const index_t resident = static_cast<index_t>(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  index_t g = work < resident ? work : resident;
  if (max_blocks > 0 && g > max_blocks) g = max_blocks;
  if (g > max_grid) g = max_grid;
  return g < 1 ? 1 : g;
}

// 16-byte loads need every per-token array of T aligned to 16 bytes (a thread's 4 tokens start
// at a multiple of 4) and the byte arrays (mask, kept flags) to 4 bytes. Null pointers are absent
// inputs and do not count.
struct token_pointers {
  std::uintptr_t values[8] = {};  // per-token arrays of T, inputs and gradients
  int value_count = 0;
  std::uintptr_t bytes[2] = {};   // mask, kept flags
  int byte_count = 0;

  void add_value(const void* p) {
    if (p != nullptr) values[value_count++] = reinterpret_cast<std::uintptr_t>(p);
  }
  void add_bytes(const void* p) {
    if (p != nullptr) bytes[byte_count++] = reinterpret_cast<std::uintptr_t>(p);
  }
};

inline bool vector_aligned(const token_pointers& p) {
  for (int k = 0; k < p.value_count; ++k)
    if (p.values[k] % 16 != 0) return false;
  for (int k = 0; k < p.byte_count; ++k)
    if (p.bytes[k] % 4 != 0) return false;
  return true;
}

inline launch_config make_launch_config(const shape& sh, const stages& st, const device_limits& dev, const token_pointers& ptrs,
                      bool allow_vector_loads, int max_blocks) {
  launch_config p;
  p.response_grid = grid_for(ceil_div(sh.groups, warps_per_response_block), dev.sms, dev.response_blocks_per_sm,
                             max_blocks);
  if (st.finalize || st.sequence_in_finalize)
    p.finalize_grid = grid_for(ceil_div(sh.responses, warps_per_finalize_block), dev.sms,
                               dev.finalize_blocks_per_sm, max_blocks);
  p.tiles = ceil_div(sh.tokens, token_tile);
  p.token_grid = grid_for(p.tiles, dev.sms, dev.token_blocks_per_sm, max_blocks);
  p.vector_loads = allow_vector_loads && vector_aligned(ptrs);
  p.fused_kernels = 2 + (p.finalize_grid > 0 ? 1 : 0);
  p.generic_selection = st.selection;
  p.generic_kept_counts = st.kept_counts;
  p.generic_entropy_quantile = st.entropy_quantile;
  p.st = st;
  return p;
}

// Bytes per token of one call, for the benchmarks' bandwidth figures and the documentation.
// compulsory: every per-token input read once and every per-token output written once.
// fused_extra: what the fused kernels read on top of that (kernel A's per-response reads: the
// mask for the counts, old_logp for response weights, logp and old_logp for sequence ratios).
// The generic sort-based fallbacks (selection, entropy quantiles) are not included.
struct token_inputs {
  std::size_t value_bytes = 4;  // sizeof(T)
  bool old_logp = true, ref_logp = false, entropy = false, mask = true, token_weights = false;
  bool kept_flags = false;      // kernel B reads the kept flags of a selection (1 byte)
  bool entropy_gradient = false;
};

struct traffic {
  double compulsory = 0;
  double fused_extra = 0;
  double fused_total() const { return compulsory + fused_extra; }
};

inline traffic traffic_per_token(const stages& st, const token_inputs& in) {
  const double v = static_cast<double>(in.value_bytes);
  traffic t;
  t.compulsory = v;  // logp
  if (in.old_logp) t.compulsory += v;
  if (in.ref_logp) t.compulsory += v;
  if (in.entropy) t.compulsory += v;
  if (in.mask) t.compulsory += 1;
  if (in.token_weights) t.compulsory += v;
  t.compulsory += v;  // grad_logp
  if (in.entropy_gradient) t.compulsory += v;
  if (in.kept_flags) t.fused_extra += 1;  // written by the generic selection, read by kernel B
  // Kernel A reads each array it needs once per group (a group's re-reads hit L2): the mask
  // for the counts and valid spans, old_logp (logp when on-policy) for response weights, logp and
  // old_logp for a sequence ratio whose advantages are final after the group stage.
  bool a_mask = in.mask, a_logp = false, a_old = false;
  if (st.old_mean) (in.old_logp ? a_old : a_logp) = true;
  if (st.sequence && !st.sequence_in_finalize) {
    a_logp = true;
    a_old = a_old || in.old_logp;
  }
  t.fused_extra += (a_mask ? 1 : 0) + (a_logp ? v : 0) + (a_old ? v : 0);
  // Kernel F (a sequence ratio after a batch-stage advantage) reads them again, later.
  if (st.sequence_in_finalize) t.fused_extra += (in.mask ? 1 : 0) + v + (in.old_logp ? v : 0);
  return t;
}

}  // namespace fused
RECO_NAMESPACE_END
