// The step plan: one optimizer step split into parts (micro-batches of gradient accumulation,
// data-parallel ranks, or both) with the loss and gradient of the step independent of the split
// (docs/distributed.md). Each part summarises its own data (summarize), the summaries are summed
// (an all-reduce SUM, or += in one process), finish_plan turns the sum into a plan, a selection
// takes a few more summed rounds (plan_round, step_plan::advance), and every part's call with the
// plan contributes its share:
//
//   reco::step_info step{step_number, R_step};                          // the same on every part
//   reco::step_part part{step, first_response, first_group};
//   reco::part_rounds state;                                            // optional: cut candidates
//   reco::step_summary s = reco::summarize(obj, batch, part, state);    // + all-reduce SUM
//   reco::step_plan plan = reco::finish_plan(obj, step, s);
//   while (!plan.complete()) {
//     reco::step_summary r = reco::plan_round(obj, plan, batch, part, &state);  // + all-reduce SUM
//     plan.advance(r);
//   }
//   obj(reco::cpu{}, batch, grads, ws, plan, part);                     // this part's share
//
// This header gathers the plan's own headers (reco/step_plan/):
//   step.hpp, summary.hpp, plan.hpp      the protocol: step and part, summaries, the plan's API
//   summarize.hpp, place.hpp             stage 0 (and moving a provisional summary into place)
//   finish.hpp                           the plan from the summed summaries
//   cut_rounds.hpp, covariance_rounds.hpp, round.hpp   the rounds of a selection, plan_step
//   call.hpp                             a part's call with the plan
//   part_state.hpp, token_source.hpp, host_passes.hpp, summary_pool.hpp, fingerprint.hpp,
//   cut_candidates.hpp                   what those are built from
#pragma once

#include "reco/step_plan/call.hpp"
#include "reco/step_plan/covariance_rounds.hpp"
#include "reco/step_plan/cut_rounds.hpp"
#include "reco/step_plan/finish.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/part_state.hpp"
#include "reco/step_plan/place.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/round.hpp"
#include "reco/step_plan/step.hpp"
#include "reco/step_plan/summarize.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_pool.hpp"
#include "reco/step_plan/token_source.hpp"
