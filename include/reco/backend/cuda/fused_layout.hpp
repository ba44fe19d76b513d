// The scratch of one fused call, carved out of the reusable workspace: the generic algorithm's
// per-call scalars and per-response arrays (so that the generic single-thread steps and the
// sort-based fallbacks work on them unchanged), one partial slot per block of each fused kernel,
// and the three last-block tickets. Host code only; the carve is unit-tested without a GPU.
#pragma once

#include <cstdint>

#include "reco/algorithm/partials.hpp"
#include "reco/backend/cuda/fused_partials.hpp"
#include "reco/backend/cuda/launch_plan.hpp"
#include "reco/workspace.hpp"
#include "reco/component.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

enum ticket_slot : int { ticket_response = 0, ticket_finalize = 1, ticket_token = 2, ticket_slots = 3 };

struct scratch {
  detail::objective_scalars* scalars = nullptr;
  objective_result* result = nullptr;
  detail::token_partial* tokens = nullptr;  // the merged token partial (result_fn reads it)
  detail::response_scratch r{};
  std::uint32_t* group_status = nullptr;
  std::uint8_t* group_zero_std = nullptr;
  // generic fallbacks
  double* keys = nullptr;          // selection / entropy-quantile keys (N)
  std::uint8_t* kept = nullptr;    // kept flags (N)
  index_t* tie_rank = nullptr;     // tie ranks (N + 1)
  // fused kernels
  response_block_partial* response_partials = nullptr;
  finalize_block_partial* finalize_partials = nullptr;
  token_block_partial* token_partials = nullptr;
  std::uint64_t* tickets = nullptr;

  // Two passes: once over carver(nullptr) to measure, once over the reserved buffer.
  template <class Obj>
  void carve(detail::carver& c, const shape& sh, const plan& p) {
    const index_t R = sh.responses, P = sh.groups, N = sh.tokens;
    scalars = c.take<detail::objective_scalars>(1);
    result = c.take<objective_result>(1);
    tokens = c.take<detail::token_partial>(1);
    tickets = c.take<std::uint64_t>(ticket_slots);
    r.carve_common(c, R);
    group_status = c.take<std::uint32_t>(P);
    group_zero_std = c.take<std::uint8_t>(P);
    if constexpr (Obj::selector_type::active) {
      r.kept = c.take<index_t>(R);
      kept = c.take<std::uint8_t>(N);
      tie_rank = c.take<index_t>(N + 1);
    } else {
      r.kept = r.length;  // every valid token is a policy token
    }
    if constexpr (Obj::selector_type::active || Obj::clip_type::needs_entropy_quantile) keys = c.take<double>(N);
    if constexpr (Obj::ratio_type::scope == ratio_scope::sequence) r.seq_log = c.take<double>(R);
    if constexpr (Obj::clip_type::needs_entropy_quantile) r.entropy_q = c.take<double>(R);
    response_partials = c.take<response_block_partial>(p.response_grid);
    finalize_partials = c.take<finalize_block_partial>(p.finalize_grid);
    token_partials = c.take<token_block_partial>(p.token_grid);
  }
};

// Bytes of scratch a call of this shape and plan needs.
template <class Obj>
std::size_t scratch_bytes(const shape& sh, const plan& p) {
  detail::carver measure(nullptr);
  scratch s;
  s.carve<Obj>(measure, sh, p);
  return measure.used();
}

}  // namespace fused
RECO_NAMESPACE_END
