// What one call of a split step reads from its step plan (reco/step_plan.hpp): the final
// per-response values of its slice of the step and the step's counts. Host memory: planned calls
// run on host-accessible backends.
#pragma once

#include <cstdint>

#include "reco/component.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

struct plan_call {
  // The part's slice (R entries each, response i of the call = response first + i of the step).
  const double* advantage = nullptr;  // final A_i (group and batch stages over the whole step)
  const double* weight = nullptr;     // final w_i (capped, normalised over the step)
  const std::uint8_t* capped = nullptr;
  const index_t* length = nullptr;    // valid tokens the summary saw (checked against the data)
  const index_t* ties = nullptr;      // tokens on the cut to keep per response (-1 all); selection only
  const index_t* kept = nullptr;      // tokens the step's cut keeps per response; selection only
  entropy_cut cut{};                  // selection: keep H > cut.value, and `ties` of H == cut.value
  aggregation_counts valid{};         // the step's counts for the KL / entropy terms
  aggregation_counts policy{};        // ... for the policy term
  double scale = 1;                   // multiplies every coefficient (data-parallel averaging)
};

// Per response: the kept flags from the step's cut; ties are kept in position order.
template <class T>
struct planned_kept_fn {
  token_layout layout;
  const T* values;
  const std::uint8_t* mask;
  const plan_call* plan;
  std::uint8_t* kept;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const double cut = plan->cut.value;
    index_t budget = plan->ties[i];
    const index_t e = layout.end(i);
    for (index_t t = layout.begin(i); t < e; ++t) {
      std::uint8_t k = 0;
      if (mask == nullptr || mask[t] != 0) {
        const double h = static_cast<double>(values[t]);
        if (h > cut) {
          k = 1;
        } else if (h == cut) {
          if (budget < 0) {
            k = 1;
          } else if (budget > 0) {
            k = 1;
            --budget;
          }
        }
      }
      kept[t] = k;
    }
  }
};

}  // namespace detail
RECO_NAMESPACE_END
