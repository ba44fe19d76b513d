// The arguments of one fused call's kernels, built from the objective, the batch, the carved
// scratch and the plan. Host code shared by the CUDA call (fused_objective.cuh) and the host
// emulation in the tests, so that both run the same stages on the same arguments.
#pragma once

#include <cstdint>
#include <string>

#include "reco/advantage/common.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/backend/cuda/fused_layout.hpp"
#include "reco/backend/cuda/launch_plan.hpp"
#include "reco/backend/cuda/response_step.hpp"
#include "reco/backend/cuda/token_step.hpp"
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

// The value checks a call makes (the generic algorithm's, split between kernels A and B).
template <class Obj>
detail::input_checks checks_of() {
  using adv_t = typename Obj::advantage_type;
  constexpr bool reads_rewards = adv_t::input == advantage_input::rewards;
  detail::input_checks c;
  c.ref = Obj::kl_type::active;
  c.entropy = Obj::needs_entropy;
  c.rewards = reads_rewards;
  c.advantages = !reads_rewards;
  c.response_weights = Obj::weight_type::reads_response_weights;
  return c;
}

template <class Obj, class T>
call_args<Obj, T> make_call_args(const Obj& obj, const batch_view<T>& batch, gradients<T> grads, const scratch& sc,
                                 const plan& p, const normalisers& norm, std::uint64_t epoch) {
  using adv_t = typename Obj::advantage_type;
  constexpr bool reads_rewards = adv_t::input == advantage_input::rewards;
  const detail::batch_pointers<T> b = detail::pointers_of(batch);
  detail::input_checks checks = checks_of<Obj>();
  // Given advantages may be absent only from a batch without tokens (nothing reads them there).
  checks.advantages = checks.advantages && b.advantages != nullptr;
  const bool kept_denominator = obj.kept_denominator();
  const bool with_finalize = p.finalize_grid > 0;

  call_args<Obj, T> c{};
  c.st = stages_of(obj);
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
                                     reads_rewards};
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
                               Obj::selector_type::active ? sc.kept : nullptr,
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
                               b.groups};
  return c;
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
