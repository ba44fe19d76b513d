// A part's summary of the plan's pending round (plan_round: cut or covariance rounds), and
// gradient accumulation in one process (plan_step: the parts' summaries added here instead of
// all-reduced).
#pragma once

#include <cstddef>
#include <vector>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/step_plan/call.hpp"
#include "reco/step_plan/covariance_rounds.hpp"
#include "reco/step_plan/cut_rounds.hpp"
#include "reco/step_plan/finish.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/part_state.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/summarize.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_check.hpp"
#include "reco/step_plan/token_source.hpp"

RECO_NAMESPACE_BEGIN
// A part's summary for the plan's pending round (host memory): a histogram of its entropy keys
// under the current prefix, or its per-response counts above and on the cut. `state` (optional)
// keeps the part's cut candidates from one round to the next; `tokens` (optional) reads the
// part's tokens where they are, as for summarize.
template <class Obj, class T>
step_summary plan_round(const Obj& obj, const step_plan& plan, const batch_view<T>& batch, const step_part& part,
                        part_rounds* state = nullptr, const part_token_source* tokens = nullptr) {
  using namespace detail;
  require(!plan.complete(), "plan", "is complete; no round is pending");
  require(plan_fingerprint(obj, part.step, sizeof(T)) == plan.fingerprint(), "plan",
          "was built for another step, objective or value type than this part");
  const index_t R = batch.layout.responses;
  check_part(part, R, 0);
  step_summary s = plan_summary(plan.round_body(), plan.stage_index(), sizeof(T), plan.fingerprint());
  if (plan.stage() == step_plan::stage_kind::confirm) {
    // The confirmation: the digest of the sums this part took, and whether it refused the last.
    double* v = s.values.data() + plan_header;
    write_chunks(v, v + 8, plan.digest(), 1);
    v[16] = plan.refused() ? 1 : 0;
  } else {
    const batch_pointers<T> b = pointers_of(batch);
    if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
      refuse_token_source(tokens);
      covariance_round(obj, plan, b, part, state, s);
    } else {
      fill_round(plan, b, part, state, tokens, s);
    }
  }
  // Where parts add: every value of a histogram round and of the confirmation; the header of the
  // per-response counts; the header and the trailing count of the top values.
  const bool all_added = plan.stage() == step_plan::stage_kind::histogram || plan.stage() == step_plan::stage_kind::confirm;
  seal(s, all_added ? s.size() : plan_header, plan.stage() == step_plan::stage_kind::top_values ? 1 : 0);
  return s;
}

// Gradient accumulation in one process: the plan of a step given as parts (batches[p] is part
// parts[p]), with the summaries added here instead of all-reduced.
template <class Obj, class T>
step_plan plan_step(const Obj& obj, const step_info& step, const std::vector<batch_view<T>>& batches,
                    const std::vector<step_part>& parts, const window_sampling& sampling = {}) {
  detail::require(batches.size() == parts.size() && !parts.empty(), "parts",
                  "needs one step_part per batch (and at least one)");
  step_summary total;
  std::vector<part_rounds> states(parts.size());
  for (std::size_t p = 0; p < parts.size(); ++p) total += summarize(obj, batches[p], parts[p], states[p], sampling);
  step_plan plan = finish_plan(obj, step, total);
  detail::recycle_taken(std::move(total), plan.summary_histograms());
  while (!plan.complete()) {
    step_summary round;
    for (std::size_t p = 0; p < parts.size(); ++p) round += plan_round(obj, plan, batches[p], parts[p], &states[p]);
    const std::size_t round_histograms = detail::round_histograms(plan);
    plan.advance(round);
    detail::recycle_taken(std::move(round), round_histograms);
  }
  return plan;
}
RECO_NAMESPACE_END
