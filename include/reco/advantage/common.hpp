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
// Overflow-safe: the sums run on the rewards scaled by a power of two that brings the largest
// |reward| into [0.5, 1) (exact, so ordinary rewards give the very same bits as the plain
// formulas), so squares of rewards near the double range cannot overflow. A group whose rewards
// are all equal gets mean = that reward exactly and std 0, so every s_i - mean is exactly 0.
template <class T>
RECO_HOST_DEVICE inline void group_mean_std(const group_input<T>& g, double& mean, double& std_dev) {
  mean = 0.0;
  std_dev = 0.0;
  if (g.size <= 0) return;
  const double first = static_cast<double>(g.rewards[0]);
  double largest = 0;
  bool equal = true;
  for (index_t j = 0; j < g.size; ++j) {
    const double s = static_cast<double>(g.rewards[j]);
    const double a = s < 0 ? -s : s;
    largest = a > largest ? a : largest;
    equal = equal && s == first;
  }
  if (equal) {
    mean = first;
    return;
  }
  int e = 0;
  ::frexp(largest, &e);
  // x * 2^-e rounds the exact product once, as ldexp(x, -e) does: the same bits, without a libm
  // call per reward. 2^-e and 2^e are normal doubles for |e| <= 1000 (e ranges over [-1073, 1024]).
  const bool normal = e >= -1000 && e <= 1000;
  const double down = normal ? ::ldexp(1.0, -e) : 0.0, up = normal ? ::ldexp(1.0, e) : 0.0;
  auto scaled = [&](double x) { return normal ? x * down : ::ldexp(x, -e); };
  double sum = 0;
  for (index_t j = 0; j < g.size; ++j) sum += scaled(static_cast<double>(g.rewards[j]));
  const double mean_u = sum / static_cast<double>(g.size);
  double ss = 0;
  for (index_t j = 0; j < g.size; ++j) {
    const double d = scaled(static_cast<double>(g.rewards[j])) - mean_u;
    ss += d * d;
  }
  auto unscaled = [&](double x) { return normal ? x * up : ::ldexp(x, e); };
  mean = unscaled(mean_u);
  std_dev = g.size > 1 ? unscaled(::sqrt(ss / static_cast<double>(g.size - 1))) : 0.0;
}

// 1 / d, and 0 for d = 0: a deviation divided by a zero (std + eps) is 0 / 0 (a zero std means
// every deviation is exactly 0), which the library defines as 0.
RECO_HOST_DEVICE inline double reciprocal_or_zero(double d) { return d > 0 ? 1.0 / d : 0.0; }

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
