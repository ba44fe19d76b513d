// One call from a micro-batch's last hidden states to its policy loss, without torch:
// reco::linear_policy_loss runs h, W -> logp, entropy (reco/logits/linear_logp_entropy.hpp) ->
// the objective (any preset or composition, or a part of a split step with its plan) -> dL/dh,
// dL/dW, dL/dbias (docs/logits.md, "The objective from hidden states").
//
// Two schedules, chosen from the objective's stages (linear_loss_folds):
//  - folded (3 GEMMs per chunk): when the gradient at a token is a function of that token's logp
//    and entropy alone, given per-response values that do not read the current logp (no sequence
//    ratio, no token selection, no entropy quantile, no response weight averaging the current
//    logp), each chunk's upstream gradients come from an objective call made as soon as the
//    chunk's logp is known, and the chunk's logits tile becomes its dlogits at once
//    (logits::linear_fused). The tokens not yet reached hold a stand-in logp (their old_logp, or 0
//    on-policy) and entropy 0: by the condition above that changes no gradient of the chunk's
//    tokens. The last chunk's call sees every token's logp: its result is the call's result.
//    The objective's passes are O(N) per chunk, against the chunk's O(C·V·H) GEMMs.
//  - otherwise (4 GEMMs per chunk, 3 for the last one, whose logits the forward keeps): forward,
//    the objective on the whole batch, backward (logits::linear_forward, the objective call,
//    logits::linear_backward).
#pragma once

#include <string>
#include <vector>

#include "reco/algorithm/call_stages.hpp"
#include "reco/batch.hpp"
#include "reco/logits/linear_logp_entropy.hpp"
#include "reco/objective.hpp"
#include "reco/result.hpp"
#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN

// Whether obj's gradient at a token, on this batch, depends on no other token's current logp or
// entropy: then linear_policy_loss folds it into the chunk pass (three GEMMs, no recompute).
template <class Obj, class A>
bool linear_loss_folds(const Obj& obj, const batch_view<A>& batch) {
  const objective_stages s = stages_of(obj);
  // An expected-count weight averages old_logp over each response; on-policy that is the logp.
  const bool weight_reads_logp = s.old_mean && batch.old_logp.empty() && batch.rollout_logp.empty();
  return !s.sequence && !s.selection && !s.covariance && !s.entropy_quantile && !weight_reads_logp;
}

namespace detail {

// The two schedules over `call(batch, gradients)`, the objective's call (plain or planned).
template <class Obj, class T, class Gemm, class Call>
objective_result linear_objective_pass(const Obj& obj, const Gemm& gemm, const logits::linear_operands<T>& in,
                                       const logits::linear_options& options,
                                       const batch_view<logits::accum_t<T>>& batch,
                                       const logits::linear_gradients<T>& grads, Call&& call) {
  using A = logits::accum_t<T>;
  const index_t N = in.rows;
  require(batch.logp.empty(), "batch.logp", "must be empty: this call computes logp from the hidden states");
  require(batch.entropy.empty(), "batch.entropy", "must be empty: this call computes the entropy from the hidden states");
  require(in.row_mask == nullptr, "row_mask", "must be null: the batch's mask is the row mask");
  require(in.total_vocab == 0 || in.total_vocab == in.vocab, "total_vocab",
          "is a vocabulary shard: this call takes the whole lm_head");
  require(grads.grad_logp == nullptr && grads.grad_entropy == nullptr, "grads.grad_logp",
          "must be null: the objective gives the upstream gradients");
  require(N >= 0, "rows", "must be >= 0, got " + std::to_string(N));
  if (batch.layout.kind == layout_kind::padded)
    require(batch.layout.tokens == N, "hidden",
            "has " + std::to_string(N) + " rows, the batch's layout " + std::to_string(batch.layout.tokens) + " tokens");
  require(batch.mask.empty() || batch.mask.size() == N, "batch.mask",
          "has " + std::to_string(batch.mask.size()) + " entries, hidden " + std::to_string(N) + " rows");
  require(batch.old_logp.empty() || batch.old_logp.size() == N, "batch.old_logp",
          "has " + std::to_string(batch.old_logp.size()) + " entries, hidden " + std::to_string(N) + " rows");

  const objective_needs needs = obj.needs();
  std::vector<A> logp(static_cast<std::size_t>(N), A(0)), entropy(static_cast<std::size_t>(N), A(0)),
      lse(static_cast<std::size_t>(N), A(0)), grad_logp(static_cast<std::size_t>(N), A(0)),
      grad_entropy(needs.entropy_gradient ? static_cast<std::size_t>(N) : 0, A(0));
  batch_view<A> b = batch;
  b.logp = span<const A>(logp.data(), N);
  if (needs.entropy) b.entropy = span<const A>(entropy.data(), N);
  gradients<A> g{span<A>(grad_logp.data(), N), span<A>(grad_entropy.data(), static_cast<index_t>(grad_entropy.size()))};

  logits::linear_operands<T> op = in;
  op.row_mask = batch.mask.empty() ? nullptr : batch.mask.data();
  logits::linear_outputs<A> out{logp.data(), entropy.data(), lse.data(), nullptr};
  logits::linear_gradients<T> gr = grads;

  if (!linear_loss_folds(obj, batch)) {
    logits::linear_kept_logits<A> kept;
    out.keep = &kept;
    logits::linear_forward(gemm, op, options, out);
    const objective_result result = call(b, g);
    gr.grad_logp = grad_logp.data();
    gr.grad_entropy = needs.entropy_gradient ? grad_entropy.data() : nullptr;
    gr.saved_lse = lse.data();
    gr.saved_entropy = entropy.data();
    gr.kept = &kept;
    logits::linear_backward(gemm, op, options, gr);
    return result;
  }

  // Folded: the tokens not yet reached stand in with their old_logp (ratio 1), or 0 on-policy.
  if (!batch.old_logp.empty())
    for (index_t t = 0; t < N; ++t) logp[t] = batch.old_logp[t];
  index_t remaining = 0;
  for (index_t t = 0; t < N; ++t) remaining += batch.mask.empty() || batch.mask[t] ? 1 : 0;
  objective_result result;
  bool have_result = false;
  auto chunk_gradients = [&](const index_t* rows, index_t n, const A* lp, const A* ent, A* g_logp, A* g_entropy) {
    for (index_t i = 0; i < n; ++i) logp[rows[i]] = lp[i], entropy[rows[i]] = ent[i];
    remaining -= n;
    const objective_result r = call(b, g);
    if (remaining == 0) result = r, have_result = true;
    for (index_t i = 0; i < n; ++i) {
      g_logp[i] = grad_logp[rows[i]];
      g_entropy[i] = needs.entropy_gradient ? grad_entropy[rows[i]] : A(0);
    }
  };
  logits::linear_fused(gemm, op, options, out, gr, chunk_gradients);
  // No token at all: one call gives the (zero) loss and its checks; dh is already zero.
  if (!have_result) result = call(b, g);
  return result;
}

}  // namespace detail

// The policy loss of a micro-batch from its last hidden states: logp and the entropy of the rows
// of `in` (its tokens: the sampled ids; its row_mask must be null, batch.mask is used), the
// objective's call on `batch` with them (batch.logp and batch.entropy empty: they are computed
// here; everything else as for the objective), and the gradient through the lm_head: dh written
// to grads.dhidden (or dhidden_accum), dW and dbias added to grads.dweight / dbias (each
// nullable; grads.grad_* null). Masked tokens: never read, exactly zero dh. The batch's values
// are in A = logits::accum_t<T> (float; double for double hidden states).
template <class Obj, class Backend, class Gemm, class T>
objective_result linear_policy_loss(const Obj& obj, const Backend& backend, const Gemm& gemm,
                                    const logits::linear_operands<T>& in, const logits::linear_options& options,
                                    const batch_view<logits::accum_t<T>>& batch,
                                    const logits::linear_gradients<T>& grads, workspace<Backend>& ws,
                                    const normalisers& norm = {}) {
  using A = logits::accum_t<T>;
  return detail::linear_objective_pass(obj, gemm, in, options, batch, grads,
                                       [&](const batch_view<A>& b, gradients<A> g) { return obj(backend, b, g, ws, norm); });
}

// The same for one part of a split step: the objective's planned call (reco/step_plan.hpp) with
// the step's plan and this part.
template <class Obj, class Backend, class Gemm, class T, class Plan, detail::if_step_plan<Plan> = 0>
objective_result linear_policy_loss(const Obj& obj, const Backend& backend, const Gemm& gemm,
                                    const logits::linear_operands<T>& in, const logits::linear_options& options,
                                    const batch_view<logits::accum_t<T>>& batch,
                                    const logits::linear_gradients<T>& grads, workspace<Backend>& ws, const Plan& plan,
                                    const step_part& part) {
  using A = logits::accum_t<T>;
  return detail::linear_objective_pass(
      obj, gemm, in, options, batch, grads,
      [&](const batch_view<A>& b, gradients<A> g) { return obj(backend, b, g, ws, plan, part); });
}

RECO_NAMESPACE_END
