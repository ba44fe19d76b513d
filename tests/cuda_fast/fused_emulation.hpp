// A host emulation of the fused CUDA objective: the same launch configuration, scratch layout,
// kernel arguments and per-response / per-token step functions as the device path, walked
// serially in the kernels' block / tile / thread order (each thread's response view carries over
// between its tiles as on the device). The warp and block reductions are replaced by serial
// merges, and the sort-based fallbacks run on the CPU backend. It checks on a machine without a
// GPU everything of the fused path except the device mechanics (shuffles, CUB block reductions,
// vector loads, tickets), which the GPU tests check against the generic CUDA path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/run_objective.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/cpu.hpp"
#include "reco/fused/call_args.hpp"
#include "reco/fused/layout.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/response_step.hpp"
#include "reco/fused/token_step.hpp"
#include "reco/workspace.hpp"
#include "reco/validate.hpp"

namespace fused_test {

using reco::index_t;
namespace fused = reco::fused;

struct emulation_options {
  fused::device_limits device{4, 2, 2, 2};  // a small device: many groups and tiles per block
  int max_blocks = 0;
  bool vector_loads = true;
  unsigned char fill = 0xA5;  // scratch starts as garbage: nothing may be read before written
};

struct emulation_result {
  reco::objective_result result;
  fused::launch_config launch;
};

// `step_plan`: a call of a split step (the plan's slice, host memory), as
// objective_algorithm<cuda_fused>::run takes it from objective::run with a step plan.
template <class Obj, class T>
emulation_result emulate(const Obj& obj, const reco::batch_view<T>& batch, reco::gradients<T> grads,
                         const reco::normalisers& norm = {}, const emulation_options& opt = {},
                         const reco::detail::step_slice* step_plan = nullptr) {
  using namespace reco::detail;
  // What objective::run checks before the algorithm (not the host offsets check: the device
  // path must find malformed offsets itself).
  obj.validate();
  const reco::objective_needs n = obj.needs();
  validate_batch(batch, grads, norm, n);
  const batch_pointers<T> b = pointers_of(batch);
  const index_t R = b.layout.responses, N = b.layout.tokens, P = b.groups;
  fused::check_coverage(b.layout, N, P);

  emulation_result out;
  const fused::shape sh{R, N, P};
  const fused::stages st = step_plan ? planned_stages(fused::stages_of(obj)) : fused::stages_of(obj);
  const fused::launch_config p = fused::make_launch_config(sh, st, opt.device,
                                         fused::token_pointers_of<Obj>(batch, grads), opt.vector_loads,
                                         opt.max_blocks);
  out.launch = p;
  const std::size_t bytes = fused::scratch_bytes(sh, p);
  std::unique_ptr<std::byte, void (*)(void*)> buffer(
      static_cast<std::byte*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256)), std::free);
  std::memset(buffer.get(), opt.fill, bytes);
  fused::scratch sc;
  carver cut(buffer.get());
  sc.carve(cut, sh, p);
  const reco::cpu be{};
  step_slice on_device;
  if (step_plan) on_device = sc.plan_slice.fill(be, *step_plan, R);
  const step_slice* planned = step_plan ? &on_device : nullptr;
  const auto args = fused::make_call_args(obj, batch, grads, sc, p, norm, /*epoch=*/1, planned);

  // Kernel A: warps over groups, responses of a group, then the last block.
  const auto& ra = args.response;
  constexpr index_t warps = fused::warps_per_response_block;
  for (index_t blk = 0; blk < p.response_grid; ++blk) {
    batch_partial bp{};
    response_partial rp{};
    group_partial gp{};
    for (index_t w = 0; w < warps; ++w)
    for (index_t g = blk * warps + w; g < P; g += p.response_grid * warps) {
      index_t lo, hi;
      fused::group_range(b, g, lo, hi);
      for (index_t j = lo; j < hi; ++j) {
        const index_t begin = b.layout.begin(j), end = b.layout.end(j);
        fused::scan_partial sp;
        if (!fused::scan_reads_tokens(ra)) {
          sp = fused::scan_without_tokens(begin, end);
        } else {
          sp.first = end;
          for (index_t t = begin; t < end; ++t) fused::scan_token(ra, t, sp);
        }
        fused::finish_response(ra, j, sp);
      }
      if (ra.planned) {
        for (index_t j = lo; j < hi; ++j) fused::planned_response(ra, j);
      } else {
        group_fn<Obj, T>{obj, b, sc.r, sc.group_status, sc.group_zero_std}(g);
        gp = group_partial::merge(gp, group_partial_fn{sc.group_status, sc.group_zero_std}(g));
      }
      if constexpr (Obj::ratio_type::scope == reco::ratio_scope::sequence) {
        if (ra.sequence_here)
          for (index_t j = lo; j < hi; ++j) {
            double sum = 0;
            for (index_t t = b.layout.begin(j); t < b.layout.end(j); ++t)
              sum += fused::sequence_token(obj, b, sc.r.adv[j], t);
            fused::finish_sequence<Obj>(sc.r, j, sum);
          }
      }
      for (index_t j = lo; j < hi; ++j) {
        bp = batch_partial::merge(bp, batch_partial_fn<T>{b, sc.r, ra.reads_rewards}(j));
        if (ra.final_responses) rp = response_partial::merge(rp, response_partial_fn{sc.r}(j));
      }
    }
    sc.response_partials[blk] = fused::response_block_partial{bp, gp, rp};
  }
  {
    batch_partial bp{};
    response_partial rp{};
    group_partial gp{};
    for (index_t blk = 0; blk < p.response_grid; ++blk) {
      bp = batch_partial::merge(bp, sc.response_partials[blk].batch);
      rp = response_partial::merge(rp, sc.response_partials[blk].responses);
      gp = group_partial::merge(gp, sc.response_partials[blk].groups);
    }
    fused::finish_responses(ra, bp, gp, rp);
  }

  // Kernel F: warps over responses.
  if (p.finalize_grid > 0) {
    const auto& fa = args.finalize;
    response_partial rp{};
    for (index_t i = 0; i < R; ++i) {
      finalize_response_fn<Obj>{obj, sc.r, sc.scalars}(i);
      if constexpr (Obj::ratio_type::scope == reco::ratio_scope::sequence) {
        if (fa.sequence_here) {
          double sum = 0;
          for (index_t t = b.layout.begin(i); t < b.layout.end(i); ++t)
            sum += fused::sequence_token(obj, b, sc.r.adv[i], t);
          fused::finish_sequence<Obj>(sc.r, i, sum);
        }
      }
      rp = response_partial::merge(rp, response_partial_fn{sc.r}(i));
    }
    fused::finish_finalize(fa, rp);
  }

  // The sort-based pieces: the generic passes, here on the CPU backend.
  fused::run_sorted_stages(be, obj, batch, sc, p, norm, planned);
  objective_scalars* s = sc.scalars;

  // Kernel B: blocks over tiles, threads over their token_items tokens, views per thread.
  const auto& ta = args.token;
  const reco::aggregation_counts policy = s->policy, valid = s->valid;
  for (index_t blk = 0; blk < p.token_grid; ++blk) {
    std::vector<fused::token_accumulator> acc(fused::token_block);
    std::vector<fused::response_view> views(fused::token_block);
    for (index_t walked = blk; walked < p.tiles; walked += p.token_grid)
      for (int th = 0; th < fused::token_block; ++th) {
        const index_t tile = p.tiles - 1 - walked;  // the kernel's order: from the end of the batch
        const index_t t0 = tile * fused::token_tile + static_cast<index_t>(th) * fused::token_items;
        for (int k = 0; k < fused::token_items && t0 + k < N; ++k) {
          const index_t t = t0 + k;
          const T zero(0);
          T g, ge;
          fused::token_slot(ta, policy, valid, t, b.logp[t], b.old_logp ? b.old_logp[t] : zero,
                            Obj::kl_type::active ? b.ref_logp[t] : zero, b.entropy ? b.entropy[t] : zero,
                            b.token_weights ? b.token_weights[t] : zero, b.mask ? b.mask[t] : std::uint8_t(1),
                            ta.kept ? ta.kept[t] : std::uint8_t(1), views[th], acc[th], g, ge);
          ta.grad_logp[t] = g;
          if (ta.grad_entropy) ta.grad_entropy[t] = ge;
        }
      }
    token_partial tp{};
    std::uint32_t status = 0;
    for (int th = 0; th < fused::token_block; ++th) {
      tp = token_partial::merge(tp, acc[th].to_partial());
      status |= acc[th].status;
    }
    sc.token_partials[blk] = fused::token_block_partial{tp, status};
  }
  token_partial total{};
  std::uint32_t status = 0;
  for (index_t blk = 0; blk < p.token_grid; ++blk) {
    total = token_partial::merge(total, sc.token_partials[blk].tokens);
    status |= sc.token_partials[blk].status;
  }
  fused::finish_tokens(ta, total, status);
  out.result = *sc.result;
  return out;
}

}  // namespace fused_test
