// The per-response steps of the fused objective's kernels A and F, as host/device functions: the
// kernels (response_kernel.cuh) distribute them over warps and blocks, and the tests run the
// same functions serially on the host to check them against the generic passes without a GPU.
//
// Kernel A computes, per response, what the per-response stage needs from the tokens: the
// valid-token count and first/last valid position (from the mask; from the offsets alone when
// there is no mask) and, for response weights that read it, the mean old log-prob. The value
// checks of the per-token inputs move to the token step (token_step.hpp), which reads those
// inputs anyway; offsets and per-response inputs are checked here. The status word ends up the
// same as the generic path's.
#pragma once

#include <cstdint>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/step_slice.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/token_pass.hpp"
#include "reco/fused/partials.hpp"
#include "reco/batch.hpp"
#include "reco/component.hpp"
#include "reco/detail/math.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

template <class Obj, class T>
struct response_args {
  Obj obj;
  detail::batch_pointers<T> b;
  detail::response_scratch r;
  detail::input_checks checks;
  std::uint32_t* group_status;
  std::uint8_t* group_zero_std;
  detail::objective_scalars* s;
  response_block_partial* slots;
  std::uint64_t* ticket;
  std::uint64_t epoch;
  normalisers norm;
  bool kept_denominator;
  bool final_responses;  // no kernel F follows: the response partial and the counts are final here
  bool old_mean;         // average old_logp per response (response weights read it)
  bool sequence_here;    // the sequence-scope log-ratio is computed in kernel A
  bool reads_rewards;
  // A call of a split step: the step plan's per-response values (device arrays) replace the
  // group stage, and its counts the call's own.
  bool planned;
  detail::step_slice plan;
};

// Partial scan of some of a response's tokens (one lane's share); merged by sum / min / max.
struct scan_partial {
  index_t n = 0;
  index_t first = 0;  // initialise with the response's end
  index_t last = -1;
  double old_sum = 0;
};

// Whether kernel A must read tokens at all for this call.
template <class Obj, class T>
RECO_HOST_DEVICE inline bool scan_reads_tokens(const response_args<Obj, T>& a) {
  return a.b.mask != nullptr || a.old_mean;
}

// Adds token t (in the response's range) to a scan partial.
template <class Obj, class T>
RECO_HOST_DEVICE inline void scan_token(const response_args<Obj, T>& a, index_t t, scan_partial& p) {
  const detail::batch_pointers<T>& b = a.b;
  if (!b.valid(t)) return;
  ++p.n;
  p.first = t < p.first ? t : p.first;
  p.last = t > p.last ? t : p.last;
  if (a.old_mean) p.old_sum += static_cast<double>(b.old_logp ? b.old_logp[t] : b.logp[t]);
}

// The whole-range result when no token needs reading (no mask, no old mean).
RECO_HOST_DEVICE inline scan_partial scan_without_tokens(index_t begin, index_t end) {
  scan_partial p;
  p.n = end - begin;
  p.first = begin;
  p.last = end - 1;
  return p;
}

// Writes response i's scratch from its merged scan: the generic response scan's outputs, with
// the offsets and per-response checks.
template <class Obj, class T>
RECO_HOST_DEVICE inline void finish_response(const response_args<Obj, T>& a, index_t i, const scan_partial& p) {
  const detail::batch_pointers<T>& b = a.b;
  const token_layout& L = b.layout;
  std::uint32_t st = 0;
  if (L.kind == layout_kind::packed) {
    const index_t o0 = L.offsets[i], o1 = L.offsets[i + 1];
    if (o1 < o0 || o0 < 0 || o1 > L.tokens) st |= bad_token_offsets;
    if (i == 0 && o0 != 0) st |= bad_token_offsets;
    if (i == L.responses - 1 && o1 != L.tokens) st |= bad_token_offsets;
  }
  const detail::input_checks& c = a.checks;
  if (c.rewards && !detail::finite(static_cast<double>(b.rewards[i]))) st |= bad_rewards;
  if (c.advantages && !detail::finite(static_cast<double>(b.advantages[i]))) st |= bad_advantages;
  if (c.response_weights) {
    const double w = static_cast<double>(b.response_weights[i]);
    if (!detail::finite(w) || w < 0) st |= bad_response_weights;
  }
  const index_t n = p.n;
  a.r.length[i] = n;
  a.r.first[i] = n > 0 ? p.first : -1;
  a.r.last[i] = n > 0 ? p.last : -1;
  a.r.old_mean[i] = n > 0 ? p.old_sum / static_cast<double>(n) : 0.0;
  a.r.status[i] = st;
  if constexpr (Obj::selector_type::active) a.r.kept[i] = n;  // until the selection counts them
}

// The responses of group g: the generic group stage's clamped range.
template <class T>
RECO_HOST_DEVICE inline void group_range(const detail::batch_pointers<T>& b, index_t g, index_t& lo, index_t& hi) {
  const index_t R = b.layout.responses;
  lo = b.group_offsets[g];
  hi = b.group_offsets[g + 1];
  lo = lo < 0 ? 0 : (lo > R ? R : lo);
  hi = hi < lo ? lo : (hi > R ? R : hi);
}

// One token's term of the sequence log-ratio (the generic sequence pass's summand).
template <class Obj, class T>
RECO_HOST_DEVICE inline double sequence_token(const Obj& obj, const detail::batch_pointers<T>& b, double advantage,
                                              index_t t) {
  if (!b.valid(t)) return 0.0;
  token_context c;
  c.advantage = advantage;
  c.logp = static_cast<double>(b.logp[t]);
  c.old_logp = b.old_logp ? static_cast<double>(b.old_logp[t]) : c.logp;
  return obj.ratio.sequence_term(c);
}
template <class Obj>
RECO_HOST_DEVICE inline void finish_sequence(const detail::response_scratch& r, index_t i, double sum) {
  r.seq_log[i] = detail::sequence_value<typename Obj::ratio_type>(sum, r.length[i]);
}

// Kernel A's last block: the merged partials into the call's scalars, then the generic
// single-thread steps (batch statistics; the aggregation counts when no kernel F follows).
template <class Obj, class T>
RECO_HOST_DEVICE inline void finish_responses(const response_args<Obj, T>& a, const detail::batch_partial& batch,
                                              const detail::group_partial& groups,
                                              const detail::response_partial& responses) {
  detail::objective_scalars* s = a.s;
  *s = detail::objective_scalars{};
  s->batch = batch;
  s->groups = groups;
  // A planned call has its advantages and weights from the step: no batch statistics.
  if (a.planned)
    s->status = batch.status;
  else
    detail::batch_stats_fn<Obj>{s, a.obj}(0);
  if (a.final_responses) {
    s->responses = responses;
    detail::counts_fn<Obj>{s, a.norm, a.b.layout, a.kept_denominator}(0);
    if (a.planned) detail::planned_counts_fn{s, a.plan.valid, a.plan.policy}(0);
  }
}

// Response i of a planned call, once its scan is in place: the plan's values in place of the
// group stage's (detail::take_planned_response, the generic path's step).
template <class Obj, class T>
RECO_HOST_DEVICE inline void planned_response(const response_args<Obj, T>& a, index_t i) {
  detail::take_planned_response(a.plan, a.r, i, a.b.advantages != nullptr || a.reads_rewards);
}

// Kernel F: batch-stage advantages (batch std, REINFORCE++ whitening, GPG scaling) and batch-mean
// weight normalisation, then a sequence-scope log-ratio that may read the final advantage's sign.
template <class Obj, class T>
struct finalize_args {
  Obj obj;
  detail::batch_pointers<T> b;
  detail::response_scratch r;
  detail::objective_scalars* s;
  finalize_block_partial* slots;
  std::uint64_t* ticket;
  std::uint64_t epoch;
  normalisers norm;
  bool kept_denominator;
  bool sequence_here;
};

template <class Obj, class T>
RECO_HOST_DEVICE inline void finish_finalize(const finalize_args<Obj, T>& a, const detail::response_partial& responses) {
  a.s->responses = responses;
  detail::counts_fn<Obj>{a.s, a.norm, a.b.layout, a.kept_denominator}(0);
}

}  // namespace fused
RECO_NAMESPACE_END
