// ReMax's advantage (verl's remax for outcome rewards): A_i = s_i - b_i, with b_i a baseline
// reward per response, usually the reward of the greedy rollout of the same prompt. The
// estimator interface sees only rewards, so this is a batch op: pass its output to the loss as
// given advantages (given_advantage).
#pragma once

#include "reco/algorithm/select_tokens.hpp"
#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
template <class T>
struct remax_fn {
  const T* rewards;
  const T* baselines;
  T* out;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    out[i] = static_cast<T>(static_cast<double>(rewards[i]) - static_cast<double>(baselines[i]));
  }
};
}  // namespace detail

// advantages[i] = rewards[i] - baselines[i]; advantages may alias rewards. A NaN or infinite
// reward or baseline is an error naming the array (it would reach the loss as a NaN gradient).
template <class Backend, class T>
void remax_advantages(const Backend& backend, span<const T> rewards, span<const T> baselines, span<T> advantages,
                      workspace<Backend>& ws) {
  detail::require(baselines.size() == rewards.size(), "baselines", "needs one entry per reward");
  detail::require(advantages.size() == rewards.size(), "advantages", "needs one entry per reward");
  const index_t n = rewards.size();
  if (n == 0) return;
  const Backend be = ws.bind(backend);
  detail::carver measure(nullptr);
  measure.take<double>(1);
  detail::carver carve(ws.reserve(be, measure.used()));
  double* bad = carve.take<double>(1);
  be.reduce(n, detail::count_nonfinite_fn<T>{rewards.data(), nullptr}, detail::sum_fn{}, bad);
  if (be.read(bad) > 0) detail::fail("rewards", "NaN or infinite value");
  be.reduce(n, detail::count_nonfinite_fn<T>{baselines.data(), nullptr}, detail::sum_fn{}, bad);
  if (be.read(bad) > 0) detail::fail("baselines", "NaN or infinite value");
  be.for_each(n, detail::remax_fn<T>{rewards.data(), baselines.data(), advantages.data()});
}

RECO_NAMESPACE_END
