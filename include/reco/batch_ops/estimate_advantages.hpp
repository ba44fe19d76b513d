// Per-response advantages of an advantage estimator, on the host: the estimator's group stage
// over each prompt group, then its batch stage over the batch statistics. The objective's
// response passes run the same two stages on the backend (algorithm/response_passes.hpp); both
// build the batch statistics with advantage_stats_of, so an estimator means one thing in a loss
// and in the batch op that hands its advantages to another trainer.
#pragma once

#include <cstdint>

#include "reco/algorithm/partials.hpp"
#include "reco/component.hpp"
#include "reco/detail/moments.hpp"
#include "reco/objective.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

// advantages[i] of response i, in double. group_offsets: P + 1 non-decreasing offsets from 0 to
// R (checked by the caller); lengths: valid tokens per response (read by the estimators that
// weight by length; zeros otherwise). Returns the status bits of the group stage
// (singleton_group, ...) for the caller to report; the outputs are then unspecified.
template <class Est>
std::uint32_t estimate_advantages(Est est, span<const double> rewards, span<const index_t> group_offsets,
                                  span<const index_t> lengths, span<double> advantages) {
  const index_t R = rewards.size();
  detail::require(lengths.size() == R, "lengths", "needs one entry per response");
  detail::require(advantages.size() == R, "advantages", "needs one entry per response");
  detail::prepare_component(est);
  std::uint32_t status = 0;
  for (index_t g = 0; g + 1 < group_offsets.size(); ++g) {
    const index_t lo = group_offsets[g], hi = group_offsets[g + 1];
    if (hi == lo) continue;
    const group_input<double> gi{hi - lo, rewards.data() + lo, lengths.data() + lo};
    est.group(gi, advantages.data() + lo, status);
  }
  if (status != 0) return status;
  if constexpr (Est::batch_stage != advantage_batch_stage::none) {
    detail::moments reward, token;
    double nonzero = 0;
    for (index_t i = 0; i < R; ++i) {
      reward = detail::moments::merge(reward, detail::moments::of(rewards[i]));
      nonzero += rewards[i] != 0 ? 1.0 : 0.0;
      token = detail::moments::merge(token, detail::moments::of(advantages[i], static_cast<double>(lengths[i])));
    }
    const advantage_batch_stats stats = detail::advantage_stats_of(reward, nonzero, token);
    for (index_t i = 0; i < R; ++i) advantages[i] = est.finalize(advantages[i], stats);
  }
  return status;
}

RECO_NAMESPACE_END
