// Stage 0 of the step plan: a part's summary of its own data (summarize), with no communication.
// With a part_rounds and an 80/20 cut to find on the host, a large part's summary is windowed: it
// counts only the first digits around a quantile of a sample of its entropies and keeps those
// tokens as its cut candidates (window_sampling).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/backend/cpu/packed_covariance.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/host_passes.hpp"
#include "reco/step_plan/part_state.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_check.hpp"
#include "reco/step_plan/token_source.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {
// A windowed part's id (part_rounds::window): in [1, 2^20], so that the sum over up to 2^33 parts
// is exact in a double. Random per thread: a state that did not make the summary a plan summed
// (summarised again, another part's) confirms with another id and the plan counts every digit.
inline std::uint64_t next_window_id() {
  thread_local std::uint64_t x = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^
                                 static_cast<std::uint64_t>(std::random_device{}()) ^
                                 reinterpret_cast<std::uintptr_t>(&x);
  x += 0x9e3779b97f4a7c15ull;  // splitmix64
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z >> 44) + 1;
}

// The first digits a part's windowed stage 0 counts one by one (window_sampling) for a cut that
// keeps the top fraction rho, or an empty window (lo > hi) when it should count every digit.
template <class T>
digit_window sampled_window(const batch_pointers<T>& b, double rho, const window_sampling& ws) {
  digit_window w;
  if (ws.stride < 1) return w;
  thread_local std::vector<std::uint32_t> h(digit_histogram_size, 0);  // all zero between calls
  std::uint64_t range[2];
  const double n = sample_first_digits(b, ws.stride, h.data(), range);
  if (n >= ws.min_samples && n >= 1) {
    // The sample's ranks of the part's own target, widened (ascending ranks; clamped: the ends).
    const double q = std::min(std::max(rho, 0.0), 1.0);
    const double centre = (1.0 - q) * (n - 1), half = ws.margin * std::sqrt(q * (1.0 - q) * n) + ws.slack * n + 1;
    double below_lo = 0, below_hi = n;
    std::uint64_t lo = 1, hi = key_digits - 1;
    if (centre - half > 0) lo = std::max<std::uint64_t>(digit_at_rank(h.data(), std::floor(centre - half), below_lo), 1);
    if (centre + half < n - 1) {
      hi = digit_at_rank(h.data(), std::ceil(centre + half), below_hi);
      below_hi += h[hi];
    }
    if (lo <= hi && below_hi - below_lo <= ws.max_fraction * n) w = digit_window{lo, hi};
  }
  if (range[0] <= range[1]) {
    for (std::uint64_t d = range[0]; d <= range[1]; ++d) h[d] = 0;
    for (std::uint64_t g = range[0] >> digit_group_bits; g <= range[1] >> digit_group_bits; ++g) h[key_digits + g] = 0;
  }
  return w;
}
template <class Obj, class T>
digit_window sampled_window(const Obj& obj, const batch_pointers<T>& b, const window_sampling& ws) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type> || !Obj::selector_type::active) return {};
  else return sampled_window(b, term_of(obj.select).params.rho, ws);
}

// Whether every valid token of `values` passes `ok` (a value check the summary carries as a flag).
template <class T, class Ok>
bool valid_tokens_pass(const batch_pointers<T>& b, const T* values, Ok ok) {
  for (index_t i = 0; i < b.layout.responses; ++i)
    for (index_t t = b.layout.begin(i); t < b.layout.end(i); ++t)
      if ((b.mask == nullptr || b.mask[t] != 0) && !ok(static_cast<double>(values[t]))) return false;
  return true;
}

// The offsets' errors as summary flags (validate_offsets_host's checks, which name them).
template <class T>
std::uint32_t offsets_status(const batch_view<T>& batch) {
  try {
    validate_offsets_host(batch);
  } catch (const error& e) {
    return e.argument() == "batch.group_offsets" ? bad_group_offsets : bad_token_offsets;
  }
  return 0;
}

// A part's place in the step, checked before its summary is allocated.
inline void check_part(const step_part& part, index_t responses, index_t groups) {
  check_step(part.step, "part.step");
  const index_t R_step = part.step.responses;
  require(part.first_response >= 0 && part.first_response <= R_step && responses <= R_step - part.first_response,
          "part.first_response",
          "the part's " + std::to_string(responses) + " responses from " + std::to_string(part.first_response) +
              " must lie in the step's " + std::to_string(R_step));
  require(part.first_group >= 0 && part.first_group < (index_t{1} << 53) - groups, "part.first_group",
          "is " + std::to_string(part.first_group) + "; group ids lie in [0, 2^53)");
}

}  // namespace detail

// The checks of stage 0 that throw where they are: the objective's parameters, the part's shapes
// and which inputs it gives, its place in the step. They read no values (those are flags in the
// summary, thrown by finish_plan on every part alike), so a caller with collectives can run them
// before its first one and exchange their errors (reco::torch::build_step_plan does).
template <class Obj, class T>
void check_part_inputs(const Obj& obj, const batch_view<T>& batch, const step_part& part) {
  obj.validate();
  const objective_needs needs = obj.needs();
  detail::validate_inputs(batch, needs);
  detail::validate_rollout_logp(batch, detail::weight_reads_rollout_logp(obj.weight), true, false);
  detail::validate_token_advantages(batch, true, false);
  detail::check_part(part, batch.layout.responses, batch.group_offsets.size() - 1);
}

// The stage-0 summary of a part its rank cannot summarise (its inputs failed a check that is no
// value's flag: a shape, a missing input, a conversion): its refusal alone, at the size of the
// step's summaries, so that the rank still joins the all-reduce and every rank raises the same
// error from the sums (finish_plan), naming `argument` where refusal_arguments holds it.
template <class Obj>
step_summary refusal_summary(const Obj& obj, const step_info& step, const std::string& argument) {
  using namespace detail;
  check_step(step, "part.step");
  const std::size_t block = stage0_block(obj, step.responses);
  step_summary s;
  s.values = summary_storage(plan_header + block + plan_fields * static_cast<std::size_t>(step.responses));
  s.values[plan_h_parts] = 1;
  s.values[plan_h_width] = 8;
  for (int k = 0; k < plan_status_bits; ++k)
    if (bad_part_input & (1u << k)) s.values[plan_h_status + k] = 1;
  const double code = refusal_code(argument);
  s.values[plan_h_refused] = code;
  s.values[plan_h_refused + 1] = code * code;
  seal(s, plan_header + (summary_has_histogram(obj) ? plan_histogram : 0), 0);
  return s;
}

namespace detail {
template <class Obj, class T>
step_summary summarize_part(const Obj& obj, const batch_view<T>& batch, const step_part& part,
                            const part_token_source* tokens, part_rounds* state, const window_sampling& ws) {
  check_part_inputs(obj, batch, part);
  constexpr bool covariance = is_covariance_selection_v<typename Obj::selector_type>;
  if (covariance) refuse_token_source(tokens);
  const objective_needs needs = obj.needs();
  const step_info& st = part.step;
  const index_t R = batch.layout.responses;

  const std::uint64_t fp = plan_fingerprint(obj, st, sizeof(T));
  const bool histogram = summary_has_histogram(obj);
  const std::size_t fields = plan_fields * static_cast<std::size_t>(st.responses);
  const std::size_t hist = stage0_block(obj, st.responses);  // the body: the block, then the fields
  step_summary s;
  try {
    s = plan_summary(hist + fields, 0, sizeof(T), fp);
  } catch (const std::bad_alloc&) {
    fail("part.step.responses", "is " + std::to_string(st.responses) + ": the summary's " +
                                    std::to_string(plan_header + hist + fields) + " doubles do not fit in memory");
  }
  // Offsets that do not describe the part's tokens: the summary carries the error, reading nothing.
  if (const std::uint32_t bad = offsets_status(batch)) {
    for (int k = 0; k < plan_status_bits; ++k)
      if (bad & (1u << k)) s.values[plan_h_status + k] = 1;
    if (state) *state = part_rounds{};
    seal(s, plan_header + (histogram ? plan_histogram : 0), 0);
    return s;
  }

  const batch_pointers<T> b = pointers_of(batch);
  plan_reads reads;
  reads.old_mean = needs_old_mean(obj.weight);
  // The entropies of an 80/20 cut (else checked by the histogram pass; a covariance selection reads none).
  reads.entropy = !covariance && term_on(obj.select) && !histogram;
  const plan_scan_fn<T> scan{b, reads};
  std::uint32_t bits = 0;
  double* body = s.values.data() + plan_header;
  // The selection's first histogram round; when the scan would only count the mask, the pass's
  // per-response counts serve instead (one read of the mask, not two).
  std::vector<index_t> counted;
  part_token_sums sums;
  digit_window window;  // the windowed stage 0's first digits (empty: every digit counted)
  if (tokens) {
    tokens->sums(reads.old_mean, term_on(obj.select), histogram, sums);
    require(sums.valid.size() == static_cast<std::size_t>(R) &&
                (!reads.old_mean || sums.old_sum.size() == static_cast<std::size_t>(R)) &&
                (!histogram || sums.histogram.size() == plan_histogram),
            "tokens", "returned token sums of the wrong size for the part's " + std::to_string(R) + " responses");
    bits |= sums.status;
    if (histogram) std::copy(sums.histogram.begin(), sums.histogram.end(), body);
  } else if (histogram) {
    if (!reads.old_mean) counted.resize(static_cast<std::size_t>(R));
    bool nonfinite = false;
    if (state) window = sampled_window(obj, b, ws);
    if (window.lo <= window.hi) {
      *state = part_rounds{};
      gather_window(b, window.lo, window.hi, state->candidates, counted.empty() ? nullptr : counted.data(),
                    &nonfinite);
    } else {
      first_digit_histogram(b, body, &nonfinite, counted.empty() ? nullptr : counted.data());
    }
    if (nonfinite) bits |= bad_entropy;
  }
  const T* input = Obj::needs_rewards ? b.rewards : (Obj::needs_advantages ? b.advantages : nullptr);
  const std::uint32_t input_bit = Obj::needs_rewards ? bad_rewards : bad_advantages;
  const T* given = needs.response_weights ? b.response_weights : nullptr;
  if (b.token_advantages && !valid_tokens_pass(b, b.token_advantages, [](double x) { return x - x == 0; }))
    bits |= bad_token_advantages;
  if (b.rollout_logp && !valid_tokens_pass(b, b.rollout_logp, [](double x) { return x <= 0 && x >= -DBL_MAX; }))
    bits |= bad_rollout_logp;
  double valid_tokens = 0;
  for (index_t g = 0; g < b.groups; ++g) {
    for (index_t i = batch.group_offsets[g]; i < batch.group_offsets[g + 1]; ++i) {
      token_scan t;
      covariance_sums cs;  // a covariance selection's sums: they count the valid tokens in the same read
      if constexpr (covariance) cs = host_covariance_sums(b, i);
      if (tokens) {
        t.n = sums.valid[static_cast<std::size_t>(i)];
        if (reads.old_mean) t.old_sum = sums.old_sum[static_cast<std::size_t>(i)];
      } else if (covariance && !reads.old_mean) {
        t.n = static_cast<index_t>(cs.n);
      } else if (counted.empty()) {
        t = scan(i);
      } else {
        t.n = counted[static_cast<std::size_t>(i)];
      }
      bits |= t.status;
      valid_tokens += static_cast<double>(t.n);
      double x = input ? static_cast<double>(input[i]) : 0.0;
      if (input && !finite(x)) bits |= input_bit;
      double m2 = 0;  // their mean (diagnostics): each call reads its own A_t
      if (b.token_advantages) x = token_advantage_mean(b, i, &m2);
      const double w = given ? static_cast<double>(given[i]) : 1.0;
      if (given && !(finite(w) && w >= 0)) bits |= bad_response_weights;
      double* f = body + hist + plan_fields * static_cast<std::size_t>(part.first_response + i);
      f[plan_f_claimed] = 1;
      f[plan_f_group] = static_cast<double>(part.first_group + g + 1);
      f[plan_f_length] = static_cast<double>(t.n);
      f[plan_f_span] = static_cast<double>(b.layout.end(i) - b.layout.begin(i));
      f[plan_f_old_mean] = t.n > 0 ? t.old_sum / static_cast<double>(t.n) : 0.0;
      f[plan_f_input] = x;
      f[plan_f_weight] = w;
      if constexpr (covariance) {
        if (!(finite(cs.logp) && cs.logp <= 0)) bits |= bad_logp;  // the step's mean logp, NaN on every part
        double* cv = body + covariance_slots * static_cast<std::size_t>(part.first_response + i);
        cv[0] = cs.logp;
        cv[1] = cs.adv;
        cv[2] = (b.token_advantages ? covariance_token_advantages : 0) + (i == 0 ? covariance_part_start : 0);
      }
    }
  }
  for (int k = 0; k < plan_status_bits; ++k)
    if (bits & (1u << k)) s.values[plan_h_status + k] = 1;
  if (window.lo <= window.hi) {
    // The histogram of a windowed part: its candidates digit by digit, the tokens above the window
    // on the digit after it and those below on the digit before it (see window_sampling).
    const cut_candidates& c = state->candidates;
    constexpr int shift = static_cast<int>(sizeof(T) * 8) - plan_digit_bits;
    std::vector<std::uint32_t> counts(window.hi - window.lo + 1, 0);
    for (const std::uint64_t k : c.keys) ++counts[(k >> shift) - window.lo];
    for (std::size_t d = 0; d < counts.size(); ++d)
      if (counts[d]) histogram_add(body, window.lo + d, counts[d]);
    double above = 0;
    for (const std::int64_t a : c.above) above += static_cast<double>(a);
    const double below = valid_tokens - above - static_cast<double>(c.keys.size());
    if (above > 0 && window.hi + 1 < plan_buckets) histogram_add(body, window.hi + 1, above);
    if (below > 0) histogram_add(body, window.lo - 1, below);
    state->window = next_window_id();
    hold_before_plan(*state, R, b.entropy, sizeof(T));
    s.values[plan_h_windows] = 1;
    s.values[plan_h_window_ids] = static_cast<double>(state->window);
  } else if (state) {
    *state = part_rounds{};
  }
  seal(s, plan_header + (histogram ? plan_histogram : 0), 0);  // the histogram is added, the fields written
  return s;
}
}  // namespace detail

// Stage 0: a part's summary (host memory). Structural errors of the part's batch throw here;
// errors in the values the plan reads (rewards or given advantages and weights, old_logp for a
// weight that averages it, the entropies of a selection) are carried in the summary and thrown by
// finish_plan on every part alike. The other per-token values are checked by the part's call.
// `tokens` (optional): the part's token passes run where its tokens are.
template <class Obj, class T>
step_summary summarize(const Obj& obj, const batch_view<T>& batch, const step_part& part,
                       const part_token_source* tokens = nullptr) {
  return detail::summarize_part(obj, batch, part, tokens, nullptr, window_sampling{});
}
// The same with the part's state for the rounds: with an 80/20 cut to find on the host, a large
// part's summary is windowed (window_sampling) and its cut candidates stay in `state` for the
// plan's rounds (pass the same state and batch to plan_round); otherwise the state is emptied.
template <class Obj, class T>
step_summary summarize(const Obj& obj, const batch_view<T>& batch, const step_part& part, part_rounds& state,
                       const window_sampling& sampling = {}, const part_token_source* tokens = nullptr) {
  return detail::summarize_part(obj, batch, part, tokens, &state, sampling);
}
RECO_NAMESPACE_END
