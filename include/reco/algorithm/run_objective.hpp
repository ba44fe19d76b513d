// The generic objective algorithm, written once over a backend: a per-response pass (counts,
// checks, advantages, weights), optional token selection / entropy quantiles / sequence ratios,
// then one per-token pass that writes the gradient and reduces the loss and diagnostics.
// Everything stays in the backend's memory and is stream-ordered on CUDA.
//
// A call of a split step (a step_slice of the step's plan) differs in three stages, each one
// function below with its own call and its planned form: the per-response values (the call's own
// group and batch stages, or the step's), the kept flags of a selection (the call's own cut, or
// the step's), and the counts and scale the coefficients take.
//
// Fast paths specialise objective_algorithm<Backend, Objective> (the seam the fused CUDA
// kernels use); the generic version below stays the in-process reference for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reco/algorithm/call_stages.hpp"
#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/algorithm/step_slice.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/concept.hpp"
#include "reco/workspace.hpp"
#include "reco/advantage/common.hpp"
#include "reco/batch.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// The stages after the per-response scan that give each response its advantage and weight: the
// group pass, the batch statistics and the finalize pass over this call's responses.
template <class Objective, class Backend, class T>
void own_response_values(const Objective& obj, const Backend& be, const batch_pointers<T>& b, response_scratch& r,
                         objective_scratch& sc, const objective_stages& st, bool reads_rewards) {
  objective_scalars* s = sc.scalars;
  const index_t R = b.layout.responses;
  be.for_each(b.groups, group_fn<Objective, T>{obj, b, r, sc.group_status, sc.group_zero_std});
  be.reduce(b.groups, group_partial_fn{sc.group_status, sc.group_zero_std}, merge_fn<group_partial>{}, &s->groups);
  be.reduce(R, batch_partial_fn<T>{b, r, reads_rewards}, merge_fn<batch_partial>{}, &s->batch);
  be.for_each(1, batch_stats_fn<Objective>{s, obj});
  if constexpr (Backend::host_accessible) {
    if (s->status) throw_data_error(b, s->status);
  }
  if (st.finalize) be.for_each(R, finalize_response_fn<Objective>{obj, r, s});
}

// The same values taken from the step's plan (computed over the whole step), after checking that
// this call's valid-token counts are those the plan's summaries saw. Host memory.
template <class Backend, class T>
void planned_response_values(const Backend& be, const step_slice& plan, const batch_pointers<T>& b,
                             response_scratch& r, objective_scalars* s, bool reads_rewards) {
  const index_t R = b.layout.responses;
  for (index_t i = 0; i < R; ++i) {
    if (r.length[i] != plan.length[i])
      fail("plan", "does not match this call's data: response " + std::to_string(i) + " has " +
                       std::to_string(r.length[i]) + " valid tokens, the plan counted " + std::to_string(plan.length[i]) +
                       " (a plan from another step or part?)");
    // Advantages given per token are this call's own (the estimator is the identity).
    take_planned_response(plan, r, i, b.advantages || reads_rewards);
  }
  be.reduce(R, batch_partial_fn<T>{b, r, reads_rewards}, merge_fn<batch_partial>{}, &s->batch);
  s->status = s->batch.status;
  if (s->status) throw_data_error(b, s->status);
}

// Clip-Cov / KL-Cov's selected tokens, in increasing order (this thread's scratch, kept between
// calls): this call's own selection, or the step's (its means and cut; the values of this call's
// tokens are those the plan ranked; the counts per response must be those the plan counted).
// Host memory.
template <class Objective, class Backend, class T>
const std::vector<index_t>& covariance_selected(const Objective& obj, const Backend& be, const batch_pointers<T>& b,
                                                response_scratch& r, objective_scratch& sc, const step_slice* plan) {
  const index_t R = b.layout.responses;
  std::vector<index_t>& selected = thread_covariance_buffers().selected;
  if (plan == nullptr) {
    covariance_select(be, obj, b, r, selected);
    return selected;
  }
  covariance_means m;
  m.adv = plan->covariance_adv;
  m.logp = plan->covariance_logp;
  covariance_buffers& buf = thread_covariance_buffers();
  buf.size_for(b.layout.tokens);
  covariance_values(obj, b, r.adv, m, plan->first, buf.value.data(), buf.in.data());
  be.for_each(R, planned_kept_fn<double>{{b.layout, buf.value.data(), buf.in.data(), *plan, sc.kept}});
  be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
  require_planned_kept(*plan, r.kept, R, "the log-probabilities or advantages ranked by covariance");
  flagged_tokens(sc.kept, b.layout.tokens, selected);
  return selected;
}

// An 80/20 selection's kept flags in sc.kept and counts in r.kept: this call's own cut, or the
// step's (the entropies must then keep what the plan counted; checked on the host).
template <class Objective, class Backend, class T>
void entropy_kept(const Objective& obj, const Backend& be, const batch_pointers<T>& b, response_scratch& r,
                  objective_scratch& sc, const step_slice* plan) {
  const index_t R = b.layout.responses;
  if (plan == nullptr) {
    if constexpr (Backend::host_accessible) {
      // The flags and their counts per response in one pass.
      compute_cut(be, b.entropy, b.mask, b.layout.tokens, term_of(obj.select).params, &sc.scalars->batch.tokens,
                  sc.keys, sc.scalars);
      mark_kept_counted(be, b.entropy, b.mask, b.layout, sc.scalars, sc.kept, r.kept);
      return;
    }
    select_tokens(be, b.entropy, b.mask, b.layout.tokens, term_of(obj.select).params, sc.scalars, sc.keys,
                  sc.tie_rank, sc.kept);
  } else {
    be.for_each(R, planned_kept_fn<T>{{b.layout, b.entropy, b.mask, *plan, sc.kept}});
  }
  be.for_each(R, kept_count_fn{b.layout, sc.kept, r.kept});
  if constexpr (Backend::host_accessible) {
    if (plan != nullptr) require_planned_kept(*plan, r.kept, R, "the entropies");
  }
}

// Whether the token pass computes the response weights (token_fn::weighs) instead of the group
// pass: a weight of each response's own mean old_logp (normalised by nothing, capped, so finite),
// a call of its own (a planned call takes the step's weights), and a backend whose token pass runs
// on packs for this batch. old_logp is then read once, by the token pass, instead of once for the
// scan's sums and again for the tokens.
template <class Objective, class Backend, class T>
bool weight_in_token_pass(const Objective& obj, const Backend& be, const objective_stages& st,
                          const batch_pointers<T>& b, const step_slice* plan) {
  if constexpr (has_packs_tokens<Backend, token_fn<Objective, T>>::value) {
    return st.old_mean && plan == nullptr && b.token_advantages == nullptr &&
           obj.weight.normalisation() == weight_normalisation::none && obj.weight.cap() > 0 &&
           be.template packs_tokens<token_fn<Objective, T>>();
  } else {
    return (void)obj, (void)be, (void)st, (void)b, (void)plan, false;
  }
}

}  // namespace detail

template <class Backend, class Objective>
struct objective_algorithm {
  template <class T>
  static const objective_result* run(const Objective& obj, const Backend& backend, const batch_view<T>& batch,
                                     gradients<T> grads, workspace<Backend>& ws, const normalisers& norm,
                                     const detail::step_slice* plan = nullptr);
};

// Defined outside the class so that it is not implicitly inline: an `extern template` of it
// (reco/backend/cpu_instances.hpp) then keeps a translation unit from compiling it at all.
template <class Backend, class Objective>
template <class T>
const objective_result* objective_algorithm<Backend, Objective>::run(const Objective& obj, const Backend& backend,
                                                                     const batch_view<T>& batch, gradients<T> grads,
                                                                     workspace<Backend>& ws, const normalisers& norm,
                                                                     const detail::step_slice* plan) {
  using namespace detail;
  const index_t tokens = batch.logp.size();
  const Backend be = ws.bind(backend).for_work(tokens);
  const batch_pointers<T> b = pointers_of(batch);
  const index_t R = b.layout.responses, N = b.layout.tokens, P = b.groups;

  // What this call reads, checks and runs, and its scratch: derived once (call_stages.hpp).
  const call_stages pl = call_stages_of(obj, b.advantages != nullptr, b.token_advantages != nullptr);
  const objective_stages& st = pl.stages;
  const bool weighs = weight_in_token_pass(obj, be, st, b, plan);
  objective_scratch sc;
  // The aggregation coefficients per response (the fused CUDA path folds them into its kernels).
  auto carve = [&](carver& c) {
    sc.carve(c, st, pl.token_advantages, R, P, N);
    sc.r.coef_policy = c.take<double>(R);
    sc.r.coef_valid = c.take<double>(R);
    if (weighs) sc.r.group_size = c.take<index_t>(R);
  };
  carver measure(nullptr);
  carve(measure);
  carver cut(ws.reserve(be, measure.used()));
  carve(cut);
  objective_scalars* s = sc.scalars;
  response_scratch r = sc.r;
  const bool reads_rewards = pl.reads_rewards;

  be.for_each(1, init_scalars_fn{s});
  // A host backend checks the values of the inputs no stage reads before the token pass in that
  // pass, so that they are read once (their error is then raised after it, from its status).
  const token_checks deferred = Backend::host_accessible ? token_pass_checks(st, plan != nullptr, weighs)
                                                         : token_checks{false, false, false, false, false};
  be.for_each(R, scan_response_fn<T>{b, pl.checks, r, deferred, st.old_mean && !weighs});
  // Advantages given per token, or not given because the batch has no token.
  if (!reads_rewards && !b.advantages) be.for_each(R, token_advantage_moments_fn<T>{b, r});
  // A step plan is a host object: only host-accessible backends read it here (reco::cuda_fused
  // specialises this algorithm and copies its slice; objective::run refuses the other backends).
  const step_slice* const planned = Backend::host_accessible ? plan : nullptr;
  if (planned != nullptr) {
    if constexpr (Backend::host_accessible) planned_response_values(be, *planned, b, r, s, reads_rewards);
  } else {
    own_response_values(obj, be, b, r, sc, st, reads_rewards);
  }

  const std::uint8_t* kept = nullptr;
  const std::vector<index_t>* removed = nullptr;  // Clip-Cov's selected tokens, left out of the policy term
  constexpr bool covariance = is_covariance_selection_v<typename Objective::selector_type>;
  const std::vector<index_t>* selected = nullptr;  // Clip-Cov / KL-Cov's selected tokens
  if constexpr (covariance) {
    static_assert(runs_host_selections_v<Backend>,
                  "reco::objective: covariance_selection (clip_cov / kl_cov) selects in host memory: it runs on "
                  "host-accessible backends (reco::cpu)");
    selected = &covariance_selected(obj, be, b, r, sc, planned);
    if (obj.select.params.mode == covariance_mode::clip) {
      // The selected tokens leave the policy term; the denominator keeps every valid token. A
      // few tokens: the token pass takes their list, not a flag per token.
      clip_cov_kept_counts(b.layout, *selected, r.length, r.kept);
      removed = selected;
    } else {
      r.kept = r.length;
    }
  } else if constexpr (Objective::selector_type::active) {
    if (st.selection) {
      entropy_kept(obj, be, b, r, sc, planned);
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
  take_step_counts(planned, s);  // a planned call normalises by the step's counts
  be.for_each(R, coefficients_fn<Objective>{obj, r, s, kept_denominator});
  scale_coefficients(planned, r, R);

  T* grad_entropy = grads.entropy.empty() ? nullptr : grads.entropy.data();
  token_fn<Objective, T> pass{obj, b, r, kept, s, grads.logp.data(), grad_entropy, kept_denominator,
                              wants_diagnostics(be), checks_split(all_token_checks(b, pl.checks), deferred, true)};
  if (removed != nullptr) {
    pass.removed = removed->data();
    pass.removed_count = static_cast<index_t>(removed->size());
  }
  pass.weighs = weighs;
  be.reduce_tokens(b.layout, pass, merge_fn<token_partial>{}, sc.tokens);
  if constexpr (Backend::host_accessible) {
    if (sc.tokens->status) throw_data_error(b, sc.tokens->status);
  }
  // The weights' statistics, now that the token pass has written the weights (host memory).
  if constexpr (Backend::host_accessible) {
    if (weighs) {
      response_partial w;
      be.reduce(R, response_weights_fn{r}, merge_fn<response_partial>{}, &w);
      s->responses.take_weights(w);
    }
  }
  if constexpr (covariance) {
    if (obj.select.params.mode == covariance_mode::kl)
      covariance_penalty(obj, b, r, *selected, grads.logp.data(), *sc.tokens);
  }
  be.for_each(1, result_fn{s, sc.tokens, sc.result, b.entropy != nullptr, reads_rewards, P});
  return sc.result;
}

RECO_NAMESPACE_END
