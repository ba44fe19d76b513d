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
#include "reco/algorithm/objective_plan.hpp"
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

  // What this call reads, checks and runs, and its scratch: derived once (objective_plan.hpp).
  const objective_plan pl = plan_of(obj, b.advantages != nullptr, b.token_advantages != nullptr);
  const objective_stages& st = pl.stages;
  objective_scratch sc;
  // The aggregation coefficients per response (the fused CUDA path folds them into its kernels).
  auto carve = [&](carver& c) {
    sc.carve(c, st, pl.token_advantages, R, P, N);
    sc.r.coef_policy = c.take<double>(R);
    sc.r.coef_valid = c.take<double>(R);
  };
  carver measure(nullptr);
  carve(measure);
  carver cut(ws.reserve(be, measure.used()));
  carve(cut);
  objective_scalars* s = sc.scalars;
  response_scratch r = sc.r;
  const bool reads_rewards = pl.reads_rewards;
  const input_checks checks = pl.checks;

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
        take_planned_response(*plan, r, i, b.advantages || reads_rewards);
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

    if (st.finalize) be.for_each(R, finalize_response_fn<Objective>{obj, r, s});
  }

  const std::uint8_t* kept = nullptr;
  constexpr bool covariance = is_covariance_selection_v<typename Objective::selector_type>;
  if constexpr (covariance) {
    // Clip-Cov / KL-Cov: selected on the host over this call's tokens, or over the step's.
    if constexpr (!Backend::host_accessible) {
      fail("select", "covariance_selection (clip_cov / kl_cov) runs on the CPU backend only");
    } else {
      if (plan != nullptr) {
        // The step's means and cut; the values of this call's tokens are those the plan ranked.
        covariance_means m;
        m.adv = plan->covariance_adv;
        m.logp = plan->covariance_logp;
        covariance_buffers& buf = thread_covariance_buffers();
        buf.size_for(N);
        covariance_values(obj, b, r.adv, m, plan->first, buf.value.data(), buf.in.data());
        be.for_each(R, planned_kept_fn<double>{{b.layout, buf.value.data(), buf.in.data(), *plan, sc.kept}});
        be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
        require_planned_kept(*plan, r.kept, R, "the log-probabilities or advantages ranked by covariance");
      } else {
        covariance_select(obj, b, r, sc.kept);
      }
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
    if (st.selection) {
      if (plan != nullptr) {
        be.for_each(R, planned_kept_fn<T>{{b.layout, b.entropy, b.mask, *plan, sc.kept}});
      } else {
        select_tokens(be, b.entropy, b.mask, N, term_of(obj.select).params, s, sc.keys, sc.tie_rank, sc.kept);
      }
      be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
      if constexpr (Backend::host_accessible) {
        // The cut was placed with the entropies the plan saw; other entropies would keep
        // another set than the one the step's counts were made for.
        if (plan != nullptr) require_planned_kept(*plan, r.kept, R, "the entropies");
      }
      kept = sc.kept;
    }
  }
  if constexpr (Objective::clip_type::needs_entropy_quantile) {
    if (st.entropy_quantile) {
      entropy_quantiles(be, b, sc.keys, r, obj.clip.percentile());
    }
  }
  if constexpr (Objective::ratio_type::scope == ratio_scope::sequence) {
    if (st.sequence) be.for_each(R, sequence_fn<Objective, T>{obj, b, r});
  }

  be.reduce(R, response_partial_fn{r}, merge_fn<response_partial>{}, &s->responses);
  const bool kept_denominator = pl.kept_denominator;
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
                   token_fn<Objective, T>{obj, b, r, kept, s, grads.logp.data(), grad_entropy, kept_denominator,
                                          wants_diagnostics(be)},
                   merge_fn<token_partial>{}, sc.tokens);
  if constexpr (covariance && Backend::host_accessible) {
    if (obj.select.params.mode == covariance_mode::kl)
      covariance_penalty(obj, b, r, sc.kept, grads.logp.data(), *sc.tokens);
  }
  be.for_each(1, result_fn{s, sc.tokens, sc.result, b.entropy != nullptr, reads_rewards, P});
  return sc.result;
}

RECO_NAMESPACE_END
