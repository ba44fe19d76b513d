// The generic objective algorithm, written once over a backend: a per-response pass (counts,
// checks, advantages, weights), optional token selection / entropy quantiles / sequence ratios,
// then one per-token pass that writes the gradient and reduces the loss and diagnostics.
// Everything stays in the backend's memory and is stream-ordered on CUDA.
//
// Fast paths specialise objective_algorithm<Backend, Objective> (the seam the fused CUDA
// kernels use); the generic version below stays the in-process reference for them.
#pragma once

#include <cstdint>
#include <string>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/plan_call.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/workspace.hpp"
#include "reco/advantage/common.hpp"
#include "reco/batch.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class T>
struct fill_entropy_keys_fn {
  batch_pointers<T> b;
  double* keys;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    keys[t] = b.valid(t) ? static_cast<double>(b.entropy[t]) : HUGE_VAL;
  }
};

// Scratch of one call, carved out of the workspace.
template <class T>
struct objective_scratch {
  objective_scalars* scalars = nullptr;
  objective_result* result = nullptr;
  token_partial* tokens = nullptr;
  response_scratch r{};
  std::uint32_t* group_status = nullptr;
  std::uint8_t* group_zero_std = nullptr;
  double* keys = nullptr;          // selection / entropy-quantile keys
  std::uint8_t* kept = nullptr;
  index_t* tie_rank = nullptr;

  template <class Obj>
  void carve(carver& c, index_t R, index_t P, index_t N) {
    scalars = c.take<objective_scalars>(1);
    result = c.take<objective_result>(1);
    tokens = c.take<token_partial>(1);
    r.carve_common(c, R);
    r.coef_policy = c.take<double>(R);
    r.coef_valid = c.take<double>(R);
    group_status = c.take<std::uint32_t>(P);
    group_zero_std = c.take<std::uint8_t>(P);
    if constexpr (Obj::selector_type::active) {
      r.kept = c.take<index_t>(R);
      kept = c.take<std::uint8_t>(N);
      tie_rank = c.take<index_t>(N + 1);
    }
    if constexpr (Obj::selector_type::active || Obj::clip_type::needs_entropy_quantile) keys = c.take<double>(N);
    if constexpr (Obj::advantage_type::input == advantage_input::advantages) r.adv_m2 = c.take<double>(R);
    if constexpr (Obj::ratio_type::scope == ratio_scope::sequence) r.seq_log = c.take<double>(R);
    if constexpr (Obj::clip_type::needs_entropy_quantile) r.entropy_q = c.take<double>(R);
  }
};

}  // namespace detail

template <class Backend, class Objective>
struct objective_algorithm {
  template <class T>
  static const objective_result* run(const Objective& obj, const Backend& backend, const batch_view<T>& batch,
                                     gradients<T> grads, workspace<Backend>& ws, const normalisers& norm,
                                     const detail::plan_call* plan = nullptr);
};

// Defined outside the class so that it is not implicitly inline: an `extern template` of it
// (reco/backend/cpu_instances.hpp) then keeps a translation unit from compiling it at all.
template <class Backend, class Objective>
template <class T>
const objective_result* objective_algorithm<Backend, Objective>::run(const Objective& obj, const Backend& backend,
                                                                     const batch_view<T>& batch, gradients<T> grads,
                                                                     workspace<Backend>& ws, const normalisers& norm,
                                                                     const detail::plan_call* plan) {
  using namespace detail;
  const index_t tokens = batch.logp.size();
  const Backend be = ws.bind(backend).for_work(tokens);
  const batch_pointers<T> b = pointers_of(batch);
  const index_t R = b.layout.responses, N = b.layout.tokens, P = b.groups;

  objective_scratch<T> sc;
  carver measure(nullptr);
  sc.template carve<Objective>(measure, R, P, N);
  carver cut(ws.reserve(be, measure.used()));
  sc.template carve<Objective>(cut, R, P, N);
  objective_scalars* s = sc.scalars;
  response_scratch r = sc.r;
  if (!b.token_advantages) r.adv_m2 = nullptr;  // read only for advantages given per token
  // Scratch a selectable component may need but does not in this call: left unread.
  if (!sequence_scoped(obj.ratio)) r.seq_log = nullptr;
  if (!needs_entropy_quantile(obj.clip)) r.entropy_q = nullptr;

  using adv_t = typename Objective::advantage_type;
  constexpr bool reads_rewards = adv_t::input == advantage_input::rewards;
  input_checks checks;
  const objective_needs needs = obj.needs();
  checks.ref = needs.ref_logp;
  checks.entropy = needs.entropy;
  checks.rewards = reads_rewards;
  checks.advantages = !reads_rewards && b.advantages;
  checks.response_weights = needs.response_weights;

  be.for_each(1, init_scalars_fn{s});
  be.for_each(R, scan_response_fn<T>{b, checks, r});
  // Advantages given per token, or not given because the batch has no token.
  if (!reads_rewards && !b.advantages) be.for_each(R, token_advantage_moments_fn<T>{b, r});
  if (plan != nullptr) {
    // A call of a split step: advantages and weights were computed over the whole step.
    if constexpr (Backend::host_accessible) {
      for (index_t i = 0; i < R; ++i) {
        if (r.length[i] != plan->length[i])
          fail("plan", "does not match this call's data: response " + std::to_string(i) + " has " +
                           std::to_string(r.length[i]) + " valid tokens, the plan counted " +
                           std::to_string(plan->length[i]) + " (a plan from another step or part?)");
        // Advantages given per token are this call's own (the estimator is the identity).
        if (b.advantages || reads_rewards) r.adv[i] = plan->advantage[i];
        r.weight[i] = plan->weight[i];
        r.capped[i] = plan->capped[i];
      }
      be.reduce(R, batch_partial_fn<T>{b, r, reads_rewards}, merge_fn<batch_partial>{}, &s->batch);
      s->status = s->batch.status;
      if (s->status) throw_data_error(b, s->status);
    }
  } else {
    be.for_each(P, group_fn<Objective, T>{obj, b, r, sc.group_status, sc.group_zero_std});
    be.reduce(P, group_partial_fn{sc.group_status, sc.group_zero_std}, merge_fn<group_partial>{}, &s->groups);
    be.reduce(R, batch_partial_fn<T>{b, r, reads_rewards}, merge_fn<batch_partial>{}, &s->batch);
    be.for_each(1, batch_stats_fn<Objective>{s, obj});
    if constexpr (Backend::host_accessible) {
      if (s->status) throw_data_error(b, s->status);
    }

    if (batch_stage_of(obj.advantage) != advantage_batch_stage::none ||
        obj.weight.normalisation() == weight_normalisation::batch_mean)
      be.for_each(R, finalize_response_fn<Objective>{obj, r, s});
  }

  const std::uint8_t* kept = nullptr;
  constexpr bool covariance = is_covariance_selection_v<typename Objective::selector_type>;
  if constexpr (covariance) {
    // Clip-Cov / KL-Cov: selected on the host over this call's tokens.
    if (plan != nullptr)
      fail("plan", "covariance_selection (clip_cov / kl_cov) ranks the tokens of one call; a split step "
                   "(step plan) is not supported");
    if constexpr (!Backend::host_accessible) {
      fail("select", "covariance_selection (clip_cov / kl_cov) runs on the CPU backend only");
    } else {
      covariance_select(obj, b, r, sc.kept);
      if (obj.select.params.mode == covariance_mode::clip) {
        // The selected tokens leave the policy term; the denominator keeps every valid token.
        for (index_t t = 0; t < N; ++t) sc.kept[t] = b.valid(t) && sc.kept[t] == 0 ? 1 : 0;
        be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
        kept = sc.kept;
      } else {
        r.kept = r.length;
      }
    }
  } else if constexpr (Objective::selector_type::active) {
    if (!term_on(obj.select)) {
      r.kept = r.length;  // a selectable selector that is off: every valid token
    } else {
      if (plan != nullptr) {
        be.for_each(R, planned_kept_fn<T>{b.layout, b.entropy, b.mask, plan, sc.kept});
      } else {
        compute_cut(be, b.entropy, b.mask, N, term_of(obj.select).params, &s->batch.tokens, sc.keys, s);
        mark_kept(be, b.entropy, b.mask, N, s, sc.tie_rank, sc.kept);
      }
      be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
      if constexpr (Backend::host_accessible) {
        // The cut was placed with the entropies the plan saw; other entropies would keep
        // another set than the one the step's counts were made for.
        if (plan != nullptr)
          for (index_t i = 0; i < R; ++i)
            if (r.kept[i] != plan->kept[i])
              fail("plan", "keeps " + std::to_string(plan->kept[i]) + " tokens of response " + std::to_string(i) +
                               " but this call's entropies keep " + std::to_string(r.kept[i]) +
                               ": the entropies differ from those the plan was built with");
      }
      kept = sc.kept;
    }
  } else {
    r.kept = r.length;
  }
  if constexpr (Objective::clip_type::needs_entropy_quantile) {
    if (needs_entropy_quantile(obj.clip)) {
      be.for_each(N, fill_entropy_keys_fn<T>{b, sc.keys});
      be.segmented_sort(sc.keys, b.layout);
      be.for_each(R, entropy_quantile_fn{b.layout, sc.keys, r, obj.clip.percentile()});
    }
  }
  if constexpr (Objective::ratio_type::scope == ratio_scope::sequence) {
    if (sequence_scoped(obj.ratio)) be.for_each(R, sequence_fn<Objective, T>{obj, b, r});
  }

  be.reduce(R, response_partial_fn{r}, merge_fn<response_partial>{}, &s->responses);
  const bool kept_denominator = obj.kept_denominator();
  be.for_each(1, counts_fn<Objective>{s, norm, b.layout, kept_denominator});
  if constexpr (Backend::host_accessible) throw_if_error(s->norm_status);  // before any gradient
  if constexpr (Backend::host_accessible) {
    if (plan != nullptr) {
      s->valid = plan->valid;
      s->policy = plan->policy;
    }
  }
  be.for_each(R, coefficients_fn<Objective>{obj, r, s, kept_denominator});
  if constexpr (Backend::host_accessible) {
    if (plan != nullptr && plan->scale != 1.0)
      for (index_t i = 0; i < R; ++i) {
        r.coef_valid[i] *= plan->scale;
        r.coef_policy[i] *= plan->scale;
      }
  }

  T* grad_entropy = grads.entropy.empty() ? nullptr : grads.entropy.data();
  be.reduce_tokens(b.layout,
                   token_fn<Objective, T>{obj, b, r, kept, s, grads.logp.data(), grad_entropy, kept_denominator},
                   merge_fn<token_partial>{}, sc.tokens);
  if constexpr (covariance && Backend::host_accessible) {
    if (obj.select.params.mode == covariance_mode::kl)
      covariance_penalty(obj, b, r, sc.kept, grads.logp.data(), *sc.tokens);
  }
  be.for_each(1, result_fn{s, sc.tokens, sc.result, b.entropy != nullptr, reads_rewards, P});
  return sc.result;
}

RECO_NAMESPACE_END
