// The per-token step of the fused objective's kernel B, as host/device functions: the kernel
// (token_kernel.cuh) runs it over tiles of tokens, and the tests run it serially on the host to
// check it against the generic token pass without a GPU.
//
// The arithmetic is the generic token pass's: the same token body and value checks
// (algorithm/token_body.hpp), scaled by the same aggregation coefficients and weights. Per token
// in the inputs' precision: double inputs on a token_context in double (each gradient the one the
// generic scalar path writes), float inputs on float lanes (detail::float_lane: every term in
// float, as the CPU's packed pass computes it; docs/conventions.md, "Precision"), the sums in
// double either way. What differs from the generic path: the per-response values are loaded once
// per run of tokens of the same response, the value checks of the per-token inputs are made here
// (as the CPU's token pass makes those its scan leaves to it), and partial sums are added in
// another order.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/fused/partials.hpp"
#include "reco/batch.hpp"
#include "reco/component.hpp"
#include "reco/detail/float_lane.hpp"
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
  double scale;  // a planned call's step scale (1 otherwise): multiplies both coefficients
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
  // Scaled as the generic path scales its coefficients (x * 1 == x: unplanned calls unchanged).
  v.policy_scale = a.obj.aggregate.coefficient(policy, n_pg) * a.scale * r.weight[i];
  v.coef = a.obj.aggregate.coefficient(valid, n) * a.scale;
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

// The per-token value type of inputs of type T: double for double inputs, float lanes otherwise.
template <class T>
using token_value_t = std::conditional_t<std::is_same_v<T, double>, double, detail::float_lane>;
RECO_HOST_DEVICE inline double widen(double x) { return x; }
RECO_HOST_DEVICE inline double widen(const detail::float_lane& x) { return static_cast<double>(x); }

// One valid token: loads it into a token context, runs the token body and the value checks
// (algorithm/token_body.hpp, the generic CPU path's own functions) and accumulates.
template <class Obj, class T>
RECO_HOST_DEVICE inline void token_step(const token_args<Obj, T>& a, const response_view& v, index_t t, T lp, T old,
                                        T ref, T h, T tw, bool keep, token_accumulator& acc, T& g_out, T& ge_out) {
  using V = token_value_t<T>;
  constexpr bool float_terms = !std::is_same_v<V, double>;
  const detail::batch_pointers<T>& b = a.b;
  basic_token_context<V> c;
  c.logp = V(static_cast<double>(lp));
  c.old_logp = b.old_logp ? V(static_cast<double>(old)) : c.logp;
  c.entropy = b.entropy ? V(static_cast<double>(h)) : V(0.0);
  c.advantage = v.advantage;
  if (a.r.seq_log) c.sequence_log_ratio = v.sequence_log_ratio;
  if (a.r.entropy_q) c.entropy_quantile = v.entropy_quantile;
  const V ref_logp = V(static_cast<double>(ref));
  const V weight = b.token_weights ? V(static_cast<double>(tw)) : V(1.0);

  // The generic response scan's value checks, made here where the values are read.
  const detail::token_checks which{b.old_logp != nullptr, a.checks.ref, a.checks.entropy, b.token_weights != nullptr};
  detail::token_faults<V> faults;
  detail::token_value_checks(faults, which, true, c.logp, c.old_logp, ref_logp, c.entropy, weight);
  acc.status |= detail::fault_status(faults);

  // Float terms without token weights: the surrogate unscaled, the response's scale (a double)
  // multiplying it in the sum, as the packed pass does per response.
  const bool scale_in_sum = float_terms && !b.token_weights;
  const V scale = b.token_weights ? V(v.policy_scale) * weight : V(v.policy_scale);
  detail::set_logp_variance(c, true);  // the diagnostic's, read by ReCo's ratio too
  const detail::token_terms<V> k = detail::token_body(a.obj, c, true, keep, ref_logp, scale, v.coef);
  ++acc.valid;
  if (keep) {
    acc.policy += scale_in_sum ? v.policy_scale * widen(k.surrogate) : widen(scale * k.surrogate);
    ++acc.policy_tokens;
    acc.clipped += k.clipped ? 1 : 0;
    acc.clip_low += k.clipped && c.advantage < 0 ? 1 : 0;
    acc.clip_high += k.clipped && c.advantage > 0 ? 1 : 0;
    acc.dual += k.dual ? 1 : 0;
    const double x = widen(k.x);
    acc.ppo_kl += widen(k.ppo_kl);
    acc.ratio_sum += x;
    acc.ratio_min = x < acc.ratio_min ? x : acc.ratio_min;
    acc.ratio_max = x > acc.ratio_max ? x : acc.ratio_max;
    acc.entropy_kept_sum += widen(c.entropy);
  }
  if constexpr (Obj::kl_type::active) {
    acc.kl += a.obj.kl.params.beta * v.coef * widen(k.kl);
    acc.kl_sum += widen(k.kl);
  }
  if constexpr (Obj::entropy_type::active) acc.entropy += widen(k.entropy_grad) * widen(c.entropy);
  ge_out = static_cast<T>(widen(k.entropy_grad));
  acc.entropy_sum += widen(c.entropy);
  // Token variance by thirds of the response's valid span (clamped both ways so that a malformed
  // batch, already flagged in the status, cannot index outside the three bins).
  const double variance = widen(c.logp_variance);
  int third = static_cast<int>((3 * (t - v.first)) / v.span);
  third = third > 2 ? 2 : (third < 0 ? 0 : third);
  if (third == 0) {
    acc.var_sum[0] += variance;
    ++acc.var_count[0];
  } else if (third == 1) {
    acc.var_sum[1] += variance;
    ++acc.var_count[1];
  } else {
    acc.var_sum[2] += variance;
    ++acc.var_count[2];
  }
  g_out = static_cast<T>(widen(k.grad));
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
