// The arguments of one fused call's kernels, built from the objective, the batch, the carved
// scratch and the launch configuration. Host code shared by the CUDA call (fused/objective.cuh)
// and the host emulation in the tests, so that both run the same stages on the same arguments.
#pragma once

#include <cstdint>
#include <string>

#include "reco/advantage/common.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/fused/layout.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/response_step.hpp"
#include "reco/fused/token_step.hpp"
#include "reco/batch.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

template <class Obj, class T>
struct call_args {
  stages st;
  response_args<Obj, T> response;
  finalize_args<Obj, T> finalize;
  token_args<Obj, T> token;
};

// `step_plan`: a planned call's plan with its arrays in the call's scratch (step_slice_arrays::fill), or
// null; `p` was then made for detail::planned_stages.
template <class Obj, class T>
call_args<Obj, T> make_call_args(const Obj& obj, const batch_view<T>& batch, gradients<T> grads, const scratch& sc,
                                 const launch_config& p, const normalisers& norm, std::uint64_t epoch,
                                 const detail::step_slice* step_plan = nullptr) {
  const detail::batch_pointers<T> b = detail::pointers_of(batch);
  // The objective's plan (call_stages.hpp): the checks split between kernels A and B, the stages.
  const detail::call_stages pl = detail::call_stages_of(obj, b.advantages != nullptr, false);
  const detail::input_checks checks = pl.checks;
  const bool reads_rewards = pl.reads_rewards;
  const bool kept_denominator = pl.kept_denominator;
  const bool with_finalize = p.finalize_grid > 0;

  call_args<Obj, T> c{};
  c.st = p.st;
  c.response = response_args<Obj, T>{obj,
                                     b,
                                     sc.r,
                                     checks,
                                     sc.group_status,
                                     sc.group_zero_std,
                                     sc.scalars,
                                     sc.response_partials,
                                     sc.tickets + ticket_response,
                                     epoch,
                                     norm,
                                     kept_denominator,
                                     !with_finalize,
                                     c.st.old_mean,
                                     c.st.sequence && !c.st.sequence_in_finalize,
                                     reads_rewards,
                                     step_plan != nullptr,
                                     step_plan != nullptr ? *step_plan : detail::step_slice{}};
  c.finalize = finalize_args<Obj, T>{obj,
                                     b,
                                     sc.r,
                                     sc.scalars,
                                     sc.finalize_partials,
                                     sc.tickets + ticket_finalize,
                                     epoch,
                                     norm,
                                     kept_denominator,
                                     c.st.sequence_in_finalize};
  c.token = token_args<Obj, T>{obj,
                               b,
                               sc.r,
                               pl.stages.selection ? sc.kept : nullptr,
                               sc.scalars,
                               grads.logp.data(),
                               grads.entropy.empty() ? nullptr : grads.entropy.data(),
                               kept_denominator,
                               checks,
                               p.vector_loads,
                               p.tiles,
                               sc.token_partials,
                               sc.tickets + ticket_token,
                               epoch,
                               sc.tokens,
                               sc.result,
                               b.entropy != nullptr,
                               reads_rewards,
                               b.groups,
                               step_plan != nullptr ? step_plan->scale : 1.0};
  return c;
}

// The stages that need a sort (token selection, entropy quantiles), run between kernels A/F and
// kernel B by the generic passes on the call's scratch: on the CUDA backend in the fused call, on
// the CPU backend in the tests' host emulation of it.
// A planned call (`step_plan`, as for make_call_args) keeps the step's cut instead of finding one,
// and checks that its kept counts are the plan's.
template <class Backend, class Obj, class T>
void run_sorted_stages(const Backend& be, const Obj& obj, const batch_view<T>& batch, const scratch& sc,
                       const launch_config& p, const normalisers& norm, const detail::step_slice* step_plan = nullptr) {
  using namespace detail;
  const batch_pointers<T> b = pointers_of(batch);
  const index_t R = b.layout.responses, N = b.layout.tokens;
  objective_scalars* s = sc.scalars;
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
    fail("select", "covariance_selection (clip_cov / kl_cov) runs on the CPU backend only");
  } else if constexpr (Obj::selector_type::active) {
    if (p.st.selection) {
      if (step_plan != nullptr) {
        be.for_each(N, planned_kept_token_fn<T>{{b.layout, b.entropy, b.mask, *step_plan, sc.kept}});
        be.for_each(R, planned_partial_ties_fn<T>{{b.layout, b.entropy, b.mask, *step_plan, sc.kept}});
        be.for_each(R, kept_count_fn{b.layout, sc.kept, sc.r.kept});
        be.for_each(R, planned_kept_check_fn{sc.r.kept, *step_plan, &s->status});
      } else {
        select_tokens(be, b.entropy, b.mask, N, term_of(obj.select).params, s, sc.keys, sc.tie_rank, sc.kept);
        if (p.st.kept_counts) be.for_each(R, kept_count_fn{b.layout, sc.kept, sc.r.kept});
      }
      if (p.st.kept_counts) {
        be.reduce(R, response_partial_fn{sc.r}, merge_fn<response_partial>{}, &s->responses);
        be.for_each(1, counts_fn<Obj>{s, norm, b.layout, true});
        if (step_plan != nullptr) be.for_each(1, planned_counts_fn{s, step_plan->valid, step_plan->policy});
      }
    }
  }
  if constexpr (Obj::clip_type::needs_entropy_quantile) {
    if (p.st.entropy_quantile) entropy_quantiles(be, b, sc.keys, sc.r, obj.clip.percentile());
  }
}

// Structural errors the generic CUDA path cannot see but the CPU path rejects (in its host check
// of the offsets): responses outside every group, or tokens outside every response. Sizes only.
inline void check_coverage(const token_layout& layout, index_t tokens, index_t groups) {
  if (groups == 0 && layout.responses > 0)
    ::reco::detail::fail("batch.group_offsets",
                         "has no group but the batch has " + std::to_string(layout.responses) + " responses");
  if (layout.kind == layout_kind::packed && layout.responses == 0 && tokens > 0)
    ::reco::detail::fail("batch.layout.offsets",
                         "describes no response but the batch has " + std::to_string(tokens) + " tokens");
}

// The pointers whose alignment decides the token kernel's vector path.
template <class Obj, class T>
token_pointers token_pointers_of(const batch_view<T>& batch, gradients<T> grads) {
  const detail::batch_pointers<T> b = detail::pointers_of(batch);
  token_pointers ptrs;
  ptrs.add_value(b.logp);
  ptrs.add_value(b.old_logp);
  ptrs.add_value(Obj::kl_type::active ? b.ref_logp : nullptr);
  ptrs.add_value(b.entropy);
  ptrs.add_value(b.token_weights);
  ptrs.add_value(grads.logp.data());
  ptrs.add_value(grads.entropy.empty() ? nullptr : grads.entropy.data());
  ptrs.add_bytes(b.mask);  // the kept flags are carved at 256-byte alignment
  return ptrs;
}

}  // namespace fused
RECO_NAMESPACE_END
