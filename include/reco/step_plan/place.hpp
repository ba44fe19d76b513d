// Moving a stage-0 summary made with a provisional place in the step to its real place
// (place_summary): a rank may summarise its micro-batches while the ranks' layout is still being
// exchanged, and place them once it is known.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_check.hpp"

RECO_NAMESPACE_BEGIN
// Moves a stage-0 summary made with a provisional place in the step to its real place: the
// summary of parts that were summarised as a step of their own (`provisional`: the same id, scale
// and configuration, their own number of responses; the first part at response 0 and group 0)
// becomes the summary of the same parts starting at response `first_response` and group
// `first_group` of `step`. A rank can so summarise its micro-batches while the ranks' layout (where
// each rank starts) is still being exchanged, and place them once it is known: the result equals
// summarising with the real parts. The fields move, their group ids shift, and the header takes
// the step's fingerprint.
template <class Obj>
void place_summary(const Obj& obj, step_summary& s, const step_info& provisional, const step_info& step,
                   index_t first_response, index_t first_group) {
  using namespace detail;
  require(checksum_holds(s), "summary", checksum_failure());
  const summed_head head = stage0_head(obj, s, provisional, "summary",
                                       "was not made for the provisional step (its id, scale, configuration and "
                                       "responses) or objective");
  const double parts = head.parts;
  const std::size_t width = head.width;
  require(step.id == provisional.id && step.scale == provisional.scale && step.config == provisional.config,
          "step", "must differ from the provisional step in its number of responses only");
  const std::size_t hist = stage0_block(obj, provisional.responses);
  const auto R = static_cast<std::size_t>(provisional.responses);
  require(s.values.size() == plan_header + hist + plan_fields * R, "summary",
          "has the wrong size for the provisional step's " + std::to_string(R) + " responses");
  require(first_group >= 0, "first_group", "must be >= 0");
  require(first_response >= 0 && provisional.responses + first_response <= step.responses, "first_response", "the parts' responses [" + std::to_string(first_response) + ", " +
                                std::to_string(first_response + provisional.responses) + ") must lie in the step's " +
                                std::to_string(step.responses));
  const auto first = static_cast<std::size_t>(first_response);
  const std::size_t shift = plan_fields * first;
  double* f = nullptr;
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
    // The covariance block is per response too: both move.
    const std::size_t slots = covariance_slots * static_cast<std::size_t>(step.responses);
    std::vector<double> v(plan_header + slots + plan_fields * static_cast<std::size_t>(step.responses), 0.0);
    std::copy(s.values.begin(), s.values.begin() + plan_header, v.begin());
    const double* old = s.values.data() + plan_header;
    std::copy(old, old + hist, v.data() + plan_header + covariance_slots * first);
    std::copy(old + hist, old + hist + plan_fields * R, v.data() + plan_header + slots + shift);
    s.values = std::move(v);
    f = s.values.data() + plan_header + slots;
  } else {
    const std::size_t body = plan_header + hist;
    s.values.resize(body + plan_fields * static_cast<std::size_t>(step.responses), 0.0);
    f = s.values.data() + body;
    if (shift > 0) {
      std::memmove(f + shift, f, plan_fields * R * sizeof(double));
      std::fill(f, f + shift, 0.0);
    }
  }
  for (std::size_t i = 0; i < R; ++i) {
    double& g = f[shift + plan_fields * i + plan_f_group];
    if (g != 0) g += static_cast<double>(first_group);  // 0: a response no part claimed
  }
  write_fingerprint(s, plan_fingerprint(obj, step, width), parts);
  seal(s);  // the moved values' checksum (the parts' sum, as their own would sum)
}
RECO_NAMESPACE_END
