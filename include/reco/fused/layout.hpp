// The scratch of one fused call, carved out of the reusable workspace: the generic algorithm's
// per-call scalars and per-response arrays (so that the generic single-thread steps and the
// sort-based fallbacks work on them unchanged), one partial slot per block of each fused kernel,
// and the three last-block tickets. Host code only; the carve is unit-tested without a GPU.
#pragma once

#include <cstdint>

#include "reco/algorithm/call_stages.hpp"
#include "reco/algorithm/step_slice.hpp"
#include "reco/fused/partials.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/workspace.hpp"
#include "reco/component.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

enum ticket_slot : int { ticket_response = 0, ticket_finalize = 1, ticket_token = 2, ticket_slots = 3 };

// The generic algorithm's scratch for the objective's stages (call_stages.hpp: the same
// carve, so the generic single-thread steps and the sort-based fallbacks work on it unchanged),
// then one partial slot per block of each fused kernel and the last-block tickets.
struct scratch : detail::objective_scratch {
  response_block_partial* response_partials = nullptr;
  finalize_block_partial* finalize_partials = nullptr;
  token_block_partial* token_partials = nullptr;
  std::uint64_t* tickets = nullptr;
  detail::step_slice_arrays plan_slice;  // a planned call: the step plan's slice, copied here

  // Two passes: once over carver(nullptr) to measure, once over the reserved buffer. The fused
  // path takes no advantages given per token (refused before the call).
  void carve(detail::carver& c, const shape& sh, const launch_config& p) {
    detail::objective_scratch::carve(c, p.st, /*token_advantages=*/false, sh.responses, sh.groups, sh.tokens);
    tickets = c.take<std::uint64_t>(ticket_slots);
    response_partials = c.take<response_block_partial>(p.response_grid);
    finalize_partials = c.take<finalize_block_partial>(p.finalize_grid);
    token_partials = c.take<token_block_partial>(p.token_grid);
    if (p.st.planned) plan_slice.carve(c, sh.responses, p.st.selection);
  }
};

// Bytes of scratch a call of this shape and launch configuration needs.
inline std::size_t scratch_bytes(const shape& sh, const launch_config& p) {
  detail::carver measure(nullptr);
  scratch s;
  s.carve(measure, sh, p);
  return measure.used();
}

}  // namespace fused
RECO_NAMESPACE_END
