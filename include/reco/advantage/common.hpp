// Shared pieces of the advantage estimators: the singleton-group policy and group statistics.
#pragma once

#include <cmath>
#include <cstdint>

#include "reco/component.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN

// What an estimator does with a group of one response (no baseline can be formed).
enum class singleton_policy : std::uint8_t {
  zero,       // A = 0 (TRL; reco's default)
  raw_score,  // baseline 0 and unit std, so A = s / (1 + eps) or s (verl)
  error,      // report batch.group_offsets as an error (OpenRLHF)
};
constexpr choice_labels<3> labels_of(singleton_policy) { return {{"zero", "raw_score", "error"}}; }

// Which per-response array the group stage reads.
enum class advantage_input : std::uint8_t { rewards, advantages };

// What an estimator needs from the whole batch after its group stage.
enum class advantage_batch_stage : std::uint8_t {
  none,           // A is final after the group stage
  reward_std,     // divide by the batch std of the rewards (PPO-Lite)
  token_whiten,   // whiten over all valid tokens (REINFORCE++ baseline)
  nonzero_scale,  // scale by R / #nonzero rewards (GPG)
};

namespace detail {

// Mean and unbiased (n - 1) standard deviation of a group's rewards, in two passes.
template <class T>
RECO_HOST_DEVICE inline void group_mean_std(const group_input<T>& g, double& mean, double& std_dev) {
  double sum = 0;
  for (index_t j = 0; j < g.size; ++j) sum += static_cast<double>(g.rewards[j]);
  mean = g.size > 0 ? sum / static_cast<double>(g.size) : 0.0;
  double ss = 0;
  for (index_t j = 0; j < g.size; ++j) {
    const double d = static_cast<double>(g.rewards[j]) - mean;
    ss += d * d;
  }
  std_dev = g.size > 1 ? ::sqrt(ss / static_cast<double>(g.size - 1)) : 0.0;
}

// Applies the singleton policy; returns true when the group was a singleton and is done.
template <class T>
RECO_HOST_DEVICE inline bool handle_singleton(const group_input<T>& g, singleton_policy policy,
                                              double raw_scale, double* out, std::uint32_t& status) {
  if (g.size != 1) return false;
  switch (policy) {
    case singleton_policy::zero: out[0] = 0.0; break;
    case singleton_policy::raw_score: out[0] = static_cast<double>(g.rewards[0]) * raw_scale; break;
    case singleton_policy::error: out[0] = 0.0; status |= singleton_group; break;
  }
  return true;
}

}  // namespace detail
RECO_NAMESPACE_END
