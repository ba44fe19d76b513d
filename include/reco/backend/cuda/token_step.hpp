// The per-token step of the fused objective's kernel B, as host/device functions: the kernel
// (token_kernel.cuh) runs it over tiles of tokens, and the tests run it serially on the host to
// check it against the generic token pass without a GPU.
//
// The arithmetic is the generic token pass's (algorithm/token_pass.hpp), expression for
// expression: the components' own functions (ratio, clip, KL) on a token_context in double,
// scaled by the same aggregation coefficients and weights, so each token's gradient is the one
// the generic path writes. What differs: the per-response values are loaded once per run of
// tokens of the same response, the value checks of the per-token inputs are made here (the
// generic path makes them in its response scan), and partial sums are added in another order.
#pragma once

#include <cmath>
#include <cstdint>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/backend/cuda/fused_partials.hpp"
#include "reco/batch.hpp"
#include "reco/component.hpp"
#include "reco/detail/math.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

template <class Obj, class T>
struct token_args {
  Obj obj;
  detail::batch_pointers<T> b;
  detail::response_scratch r;
  const std::uint8_t* kept;  // null: every valid token is a policy token
  const detail::objective_scalars* s;
  T* grad_logp;
  T* grad_entropy;  // null unless the caller passed one
  bool kept_denominator;
  detail::input_checks checks;
  bool vector_loads;
  index_t tiles;
  token_block_partial* slots;
  std::uint64_t* ticket;
  std::uint64_t epoch;
  detail::token_partial* total;
  objective_result* out;
  bool has_entropy;
  bool reads_rewards;
  index_t groups;
};

// ---- per-response values, loaded once per run of tokens of the same response -----------------

struct response_view {
  index_t i = -1;
  double advantage = 0;
  double policy_scale = 0;  // aggregation coefficient of the policy term times the response weight
  double coef = 0;          // aggregation coefficient of the KL / entropy terms
  index_t first = 0, span = 1;
  double sequence_log_ratio = 0, entropy_quantile = 0;
};

template <class Obj, class T>
RECO_HOST_DEVICE inline void load_view(const token_args<Obj, T>& a, const aggregation_counts& policy,
                                       const aggregation_counts& valid, index_t i, response_view& v) {
  const detail::response_scratch& r = a.r;
  const index_t n = r.length[i];
  const index_t n_pg = a.kept_denominator ? r.kept[i] : n;
  v.i = i;
  v.advantage = r.adv[i];
  v.policy_scale = a.obj.aggregate.coefficient(policy, n_pg) * r.weight[i];
  v.coef = a.obj.aggregate.coefficient(valid, n);
  v.first = r.first[i];
  v.span = r.last[i] - v.first + 1;
  if (r.seq_log) v.sequence_log_ratio = r.seq_log[i];
  if (r.entropy_q) v.entropy_quantile = r.entropy_q[i];
}

// The response owning token t: the generic layout lookup (last i with offsets[i] <= t).
RECO_HOST_DEVICE inline index_t owner(const token_layout& L, index_t t) { return L.response_of(t); }
// Whether token t still belongs to response i (so the lookup can be skipped). Both bounds: a
// thread's tokens ascend within a tile but its tiles descend (token_kernel.cuh).
RECO_HOST_DEVICE inline bool still_in(const token_layout& L, index_t i, index_t t) {
  if (L.kind == layout_kind::padded) return t >= i * L.max_length && t < (i + 1) * L.max_length;
  return L.offsets[i] <= t && (i + 1 >= L.responses || L.offsets[i + 1] > t);
}

// One valid token: the generic token pass's arithmetic, accumulated into `acc`.
template <class Obj, class T>
RECO_HOST_DEVICE inline void token_step(const token_args<Obj, T>& a, const response_view& v, index_t t, T lp, T old,
                                  T ref, T h, T tw, bool keep, token_accumulator& acc, T& g_out, T& ge_out) {
  const detail::batch_pointers<T>& b = a.b;
  const detail::input_checks& chk = a.checks;
  token_context c;
  c.logp = static_cast<double>(lp);
  c.old_logp = b.old_logp ? static_cast<double>(old) : c.logp;
  c.entropy = b.entropy ? static_cast<double>(h) : 0.0;
  c.advantage = v.advantage;
  if (a.r.seq_log) c.sequence_log_ratio = v.sequence_log_ratio;
  if (a.r.entropy_q) c.entropy_quantile = v.entropy_quantile;

  // The generic response scan's value checks, made here where the values are read.
  if (!detail::finite(c.logp) || (chk.probabilities && c.logp > 0)) acc.status |= bad_logp;
  if (b.old_logp && (!detail::finite(c.old_logp) || (chk.probabilities && c.old_logp > 0)))
    acc.status |= bad_old_logp;
  if (chk.ref && !detail::finite(static_cast<double>(ref))) acc.status |= bad_ref_logp;
  if (chk.entropy && !detail::finite(c.entropy)) acc.status |= bad_entropy;
  if (b.token_weights) {
    const double w = static_cast<double>(tw);
    if (!detail::finite(w) || w < 0) acc.status |= bad_token_weights;
  }

  double grad = 0;
  ++acc.valid;
  if (keep) {
    const surrogate_value sv = detail::policy_surrogate(a.obj, c);
    double scale = v.policy_scale;
    if (b.token_weights) scale *= static_cast<double>(tw);
    acc.policy += scale * sv.loss;
    grad += scale * sv.grad;
    ++acc.policy_tokens;
    acc.clipped += sv.clipped ? 1 : 0;
    acc.clip_low += sv.clipped && c.advantage < 0 ? 1 : 0;
    acc.clip_high += sv.clipped && c.advantage > 0 ? 1 : 0;
    acc.dual += sv.dual ? 1 : 0;
    acc.ppo_kl += c.old_logp - c.logp;
    acc.ratio_sum += sv.x;
    acc.ratio_min = sv.x < acc.ratio_min ? sv.x : acc.ratio_min;
    acc.ratio_max = sv.x > acc.ratio_max ? sv.x : acc.ratio_max;
    acc.entropy_kept_sum += c.entropy;
  }
  const double coef = v.coef;
  if constexpr (Obj::kl_type::active) {
    const kl_value k = a.obj.kl.eval(c.logp, static_cast<double>(ref));
    acc.kl += a.obj.kl.params.beta * coef * k.value;
    grad += a.obj.kl.params.beta * coef * k.grad;
    acc.kl_sum += k.value;
  }
  if constexpr (Obj::entropy_type::active) {
    acc.entropy += -a.obj.entropy.params.coef * coef * c.entropy;
    ge_out = static_cast<T>(-a.obj.entropy.params.coef * coef);
  } else {
    ge_out = T(0);
  }
  acc.entropy_sum += c.entropy;
  // Token variance p(1 - p) by thirds of the response's valid span (clamped both ways so that
  // a malformed batch, already flagged in the status, cannot index outside the three bins).
  int third = static_cast<int>((3 * (t - v.first)) / v.span);
  third = third > 2 ? 2 : (third < 0 ? 0 : third);
  const double var = ::exp(c.logp) * -::expm1(c.logp);
  if (third == 0) {
    acc.var_sum[0] += var;
    ++acc.var_count[0];
  } else if (third == 1) {
    acc.var_sum[1] += var;
    ++acc.var_count[1];
  } else {
    acc.var_sum[2] += var;
    ++acc.var_count[2];
  }
  g_out = static_cast<T>(grad);
}

// One token slot of a thread's run: an invalid token (mask 0) gets exactly 0 gradients and is
// not counted; a valid one finds its response (reloading the view when the response changed)
// and takes the step. `view` carries over from the previous slot of the same thread.
template <class Obj, class T>
RECO_HOST_DEVICE inline void token_slot(const token_args<Obj, T>& a, const aggregation_counts& policy,
                                        const aggregation_counts& valid, index_t t, T lp, T old, T ref, T h, T tw,
                                        std::uint8_t m, std::uint8_t kp, response_view& view, token_accumulator& acc,
                                        T& g_out, T& ge_out) {
  g_out = T(0);
  ge_out = T(0);
  if (m == 0) return;
  if (view.i < 0 || !still_in(a.b.layout, view.i, t)) load_view(a, policy, valid, owner(a.b.layout, t), view);
  token_step(a, view, t, lp, old, ref, h, tw, kp != 0, acc, g_out, ge_out);
}

// Kernel B's last block: the merged token partial into the result (the generic result step),
// plus the status bits of the value checks.
template <class Obj, class T>
RECO_HOST_DEVICE inline void finish_tokens(const token_args<Obj, T>& a, const detail::token_partial& total,
                                           std::uint32_t status) {
  *a.total = total;
  detail::result_fn{a.s, a.total, a.out, a.has_entropy, a.reads_rewards, a.groups}(0);
  a.out->status |= status;
}

}  // namespace fused
RECO_NAMESPACE_END
