// Shared piece of the response weighters: how weights are normalised after the cap.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN

// Normalisation runs over non-empty responses (empty ones carry weight 0 and no tokens).
enum class weight_normalisation : std::uint8_t {
  none,        // the raw (capped) weights: ReCo paper's form
  group_mean,  // rescale so that the mean weight of each group is 1
  batch_mean,  // rescale so that the mean weight over the batch passed in is 1
};
constexpr choice_labels<3> labels_of(weight_normalisation) { return {{"none", "group_mean", "batch_mean"}}; }

namespace detail {
// Whether a weighter reads the mean old log-probability of each response (unknown weighters:
// assume they do). Passes that average old_logp per response run only when it does.
template <class W, class = void>
struct weight_needs_old_mean : std::true_type {};
template <class W>
struct weight_needs_old_mean<W, std::void_t<decltype(W::needs_old_logp_mean)>>
    : std::bool_constant<W::needs_old_logp_mean> {};

// Whether a weighter averages batch.rollout_logp (a runtime switch of the weighter; weighters
// without one never do).
template <class W, class = void>
struct has_rollout_switch : std::false_type {};
template <class W>
struct has_rollout_switch<W, std::void_t<decltype(std::declval<const W&>().reads_rollout_logp())>> : std::true_type {};
template <class W>
bool weight_reads_rollout_logp(const W& w) {
  if constexpr (has_rollout_switch<W>::value) return w.reads_rollout_logp();
  else return false;
}

template <class W, class = void>
struct has_log_raw : std::false_type {};
template <class W>
struct has_log_raw<W, std::void_t<decltype(std::declval<const W&>().log_raw(std::declval<const response_context&>()))>>
    : std::true_type {};

// log of a weighter's raw weight: its own log_raw where it has one (so that a weight beyond the
// double range still normalises correctly), log(raw) otherwise (-inf for a zero weight).
template <class W>
RECO_HOST_DEVICE double log_raw_weight(const W& w, const response_context& c) {
  if constexpr (has_log_raw<W>::value) {
    return w.log_raw(c);
  } else {
    return ::log(w.raw(c));
  }
}
}  // namespace detail

RECO_NAMESPACE_END
