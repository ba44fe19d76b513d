// What a part keeps between the rounds of its plan (part_rounds: its cut candidates, bound to a
// plan, a batch and a part) and the settings of a windowed stage 0 (digit_window, window_sampling).
#pragma once

#include <cstddef>
#include <cstdint>

#include "reco/config.hpp"
#include "reco/step_plan/cut_candidates.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/step.hpp"

RECO_NAMESPACE_BEGIN
// What a part may keep between the rounds of its plan: the tokens a cut inside the current
// prefixes may still split (cut_candidates), gathered by its windowed summary (summarize with a
// state), by the first round after the summaries, or by gather_early while the summaries are
// being summed. With it, the later rounds and the cut counts read those few tokens instead of the
// part's data again; without it (stateless bindings), every round reads the data. All give the
// same summaries. A state belongs to one part, one batch (its entropies' address) and one plan
// (it is bound to the plan's serial, so a state kept across steps is gathered again): pass the
// same batch every round.
struct part_rounds {
  std::uint64_t plan = 0;     // the serial of the plan it was gathered for (0: nothing gathered)
  std::uint64_t pending = 0;  // gathered before the plan (summarize, gather_early) from values of this width
  std::uint64_t window = 0;   // the id of the windowed summary it was gathered by (0: none)
  index_t first_response = -1, responses = -1;
  const void* entropy = nullptr;  // the entropies (a covariance selection: logp) it was gathered from
  detail::cut_candidates candidates;
  bool left_out = false;  // a covariance selection's part left selectable tokens below its candidates
};

namespace detail {
// Marks a state's candidates as gathered before the plan (summarize, gather_early) from a batch
// of R responses with these entropies of this width: the first round of the next plan takes them.
inline void hold_before_plan(part_rounds& state, index_t R, const void* entropy, std::size_t width) {
  state.pending = width;
  state.responses = R;
  state.entropy = entropy;
}
}  // namespace detail

// A range of first digits [lo, hi] of the entropies' keys (empty when lo > hi).
struct digit_window {
  std::uint64_t lo = 1, hi = 0;
};

// The windowed stage 0 of an 80/20 cut (summarize with a part_rounds). Instead of counting every
// valid token's first digit, a part samples its entropies (the tokens of one chunk of 64 slots in
// `stride`), takes the first digits around its own quantile ± `margin` standard deviations of the
// sample's quantile and `slack` of its tokens, and reads its tokens once: the valid counts, the
// tokens inside that window (its cut candidates, kept in the state) and the counts above and
// below it. Its summary's histogram is exact inside the window, the tokens outside it counted on
// the digits next to it. The first round confirms that every windowed part's window holds the
// step's target digits; if one does not (a part whose values differ from the step's), the plan
// counts every first digit in one more round. So these settings change the cost, never the plan.
// A part with fewer than `min_samples` sampled tokens, or whose window would hold more than
// `max_fraction` of them, counts every first digit.
struct window_sampling {
  index_t stride = 17;
  double min_samples = 2048;
  double margin = 4;
  double slack = 0.0025;
  double max_fraction = 0.25;
};

namespace detail {

// Whether a part's state holds candidates gathered for this plan, part (of R responses) and batch.
inline bool gathered_for(const part_rounds& st, const step_plan& plan, const step_part& part, index_t R,
                         const void* entropy) {
  return st.plan == plan.serial() && st.first_response == part.first_response && st.responses == R &&
         st.entropy == entropy && st.candidates.lo <= st.candidates.hi;
}

}  // namespace detail
RECO_NAMESPACE_END
