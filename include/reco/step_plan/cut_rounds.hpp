// The rounds of an 80/20 cut over a split step: a part's histogram of its entropy keys under the
// plan's current prefixes, or its per-response counts above and on the cut (fill_round), from its
// cut candidates where its state holds them; and the early gathering of those candidates while
// the summaries are being summed (early_window, gather_early).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/detail/radix_keys.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/step_plan/host_passes.hpp"
#include "reco/step_plan/part_state.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/token_source.hpp"

RECO_NAMESPACE_BEGIN
// The first digits a part's cut candidates may be gathered for before the summaries are summed
// (gather_early): those that hold the targets' ranks in a histogram of the part's (or its rank's)
// own summaries, widened to the ranks `margin` standard deviations of a quantile of n
// independent draws (0.4 sqrt(n)) away, and 64 more. Parts of one step whose values come from the
// same distribution then find the step's cut inside; a part whose values differ gathers again in
// the first round. Empty (lo > hi) without a cut to find.
template <class Obj>
digit_window early_window(const Obj& obj, const step_summary& local, double margin = 4) {
  using namespace detail;
  digit_window w;
  if constexpr (!is_covariance_selection_v<typename Obj::selector_type> && Obj::selector_type::active) {
    if (!summary_has_histogram(obj) || local.values.size() < plan_header + plan_histogram) return w;
    const double* h = local.values.data() + plan_header;  // the stage-0 histogram comes first
    double n = 0;
    for (std::size_t g = 0; g < digit_groups; ++g) n += h[plan_buckets + g];
    if (n < 1) return w;
    const auto& p = term_of(obj.select).params;
    const auto N = static_cast<index_t>(n);
    index_t lo = 0, hi = 0;  // the targets' ascending ranks
    if (p.rule == selection_rule::top_k) {
      lo = hi = N - top_k_count(p.rho, N);
    } else {
      lo = static_cast<index_t>((1.0 - p.rho) * static_cast<double>(N - 1));
      hi = lo + 1 < N ? lo + 1 : lo;
    }
    const auto spread = static_cast<index_t>(margin * 0.4 * std::sqrt(n)) + 64;
    lo = lo > spread ? lo - spread : 0;
    hi = hi + spread < N ? hi + spread : N - 1;
    auto digit_of = [&](index_t rank) {  // rank < N: always found
      double below = 0;
      return static_cast<std::uint64_t>(std::min(digit_at_rank(h, static_cast<double>(rank), below), plan_buckets - 1));
    };
    w.lo = std::max<std::uint64_t>(digit_of(lo), 1);
    w.hi = digit_of(hi);
  }
  return w;
}

// Gathers a part's cut candidates for the first digits of `w` into `state` before the plan
// exists: right after the part's summary, while its data is still in the caches and the summaries
// (or the layout) are being exchanged, instead of once more after the sums arrive. The first round
// of the next plan that takes a round with this state and the same batch (the same entropies, the
// same number of responses) takes them if the step's targets fall inside the window, and gathers
// from the data if not. Needs nothing from the step: a part may gather before it knows its place.
template <class Obj, class T>
void gather_early(const Obj& obj, const batch_view<T>& batch, digit_window w, part_rounds& state,
                  const part_token_source* tokens = nullptr) {
  state = part_rounds{};
  if (!detail::summary_has_histogram(obj) || w.lo > w.hi) return;
  const detail::batch_pointers<T> b = detail::pointers_of(batch);
  detail::hold_before_plan(state, batch.layout.responses, b.entropy, sizeof(T));
  gather_part(b, detail::plan_digit_bits, w.lo, w.hi, state.candidates, tokens);
}

namespace detail {

inline bool covers(const part_rounds& st, const step_plan& plan, const step_part& part, index_t R,
                   const void* entropy, int done, std::uint64_t lo, std::uint64_t hi) {
  const cut_candidates& c = st.candidates;
  if (!gathered_for(st, plan, part, R, entropy) || c.done > done) return false;
  const int s = done - c.done;
  return (lo >> s) >= c.lo && (hi >> s) <= c.hi;
}

// Whether the cut lies inside the values of a state's prefix range (then every token outside the
// candidates is on the same side of the cut as its range; NaN bounds fail the test).
inline bool cut_inside(const cut_candidates& c, std::size_t width, double cut) {
  const int s = static_cast<int>(width * 8) - c.done;
  const std::uint64_t low = c.lo << s, high = (c.hi << s) | ((std::uint64_t(1) << s) - 1);
  return key_value(low, width) <= cut && cut <= key_value(high, width);
}

}  // namespace detail

namespace detail {
// A part's round of the plan into s (its header made): histogram or cut counts of the values
// b.entropy where b's mask is set.
template <class T>
void fill_round(const step_plan& plan, const batch_pointers<T>& b, const step_part& part, part_rounds* state,
                const part_token_source* tokens, step_summary& s) {
  const index_t R = b.layout.responses;
  const bool histogram = plan.stage() == step_plan::stage_kind::histogram;
  double* out = s.values.data() + plan_header;
  part_rounds scratch;
  part_rounds& st = state ? *state : scratch;
  // Candidates gathered early: this plan's if it is the first to take a round with them, at its
  // first round, with the batch they were gathered from.
  if (st.pending != 0) {
    if (st.plan == 0 && st.pending == sizeof(T) && plan.stage_index() == 1 && st.entropy == b.entropy &&
        st.responses == R) {
      st.plan = plan.serial();
      st.first_response = part.first_response;
    }
    st.pending = 0;
  }
  const int W = static_cast<int>(sizeof(T) * 8);
  if (histogram && plan.round() == 0) {
    // Every first digit (a windowed stage 0 missed the step's targets): one histogram.
    if (tokens) {
      part_token_sums sums;
      tokens->sums(false, false, true, sums);
      require(sums.histogram.size() == plan_histogram, "tokens", "returned a histogram of the wrong size");
      std::copy(sums.histogram.begin(), sums.histogram.end(), out);
    } else {
      bool nonfinite = false;  // checked by the summaries
      first_digit_histogram(b, out, &nonfinite);
    }
  } else if (histogram) {
    // The candidates under the targets' prefixes (the two targets of a quantile may differ),
    // gathered from the data or narrowed from the previous round's.
    const int done = plan.round() * plan_digit_bits;
    const std::uint64_t lo = plan.prefix(0), hi = plan.prefix(plan.targets() - 1);
    // After a windowed stage 0, a windowed part confirms that its window holds the targets'
    // digits (the plan compares the count and the ids with stage 0's); one that does not leaves
    // the round empty, which the plan then discards.
    const bool windowed = plan.windows() > 0 && st.window != 0 && gathered_for(st, plan, part, R, b.entropy);
    if (covers(st, plan, part, R, b.entropy, done, lo, hi)) {
      st.candidates.narrow(W, done, lo, hi);
      if (windowed) {
        s.values[plan_h_windows] = 1;
        s.values[plan_h_window_ids] = static_cast<double>(st.window);
      }
    } else if (windowed) {
      return;
    } else {
      st.plan = plan.serial();
      st.first_response = part.first_response;
      st.responses = R;
      st.entropy = b.entropy;
      gather_part(b, done, lo, hi, st.candidates, tokens);
    }
    const cut_candidates& c = st.candidates;
    const int shift = W - done - plan_digit_bits;
    for (int j = 0; j < plan.targets(); ++j) {
      double* hj = out + static_cast<std::size_t>(j) * plan_histogram;
      for (std::size_t k = 0; k < c.keys.size(); ++k)
        if ((c.keys[k] >> (W - done)) == plan.prefix(j))
          histogram_add(hj, (c.keys[k] >> shift) & (plan_buckets - 1), 1);
    }
  } else {
    const double cut = plan.cut().value;
    std::vector<std::int64_t> above(static_cast<std::size_t>(R)), on(static_cast<std::size_t>(R));
    const cut_candidates& c = st.candidates;
    if (state && gathered_for(st, plan, part, R, b.entropy) && cut_inside(c, sizeof(T), cut)) {
      // Outside the candidates' range every token lies on the side its range does.
      above = c.above;
      for (std::size_t k = 0; k < c.keys.size(); ++k) {
        const double x = key_value(c.keys[k], sizeof(T));
        const auto i = static_cast<std::size_t>(c.responses[k]);
        above[i] += x > cut;
        on[i] += x == cut;
      }
    } else if (tokens) {
      tokens->count_cut(cut, above.data(), on.data());
    } else {
      count_cut(b, cut, above.data(), on.data());
    }
    for (index_t i = 0; i < R; ++i) {
      out[2 * (part.first_response + i)] = static_cast<double>(above[i]);
      out[2 * (part.first_response + i) + 1] = static_cast<double>(on[i]);
    }
  }
}
}  // namespace detail
RECO_NAMESPACE_END
