// The storage of the step plan's summaries given back by their users, reused by the same
// thread's next summaries (recycle, recycle_taken in reco/step_plan/summary.hpp): a summary of an
// 80/20 cut is a 0.5 MiB histogram, and a fresh vector costs its page faults on every round.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// The storage of summaries given back (reco::recycle, detail::recycle_taken), reused by this
// thread's next summaries: a fresh 0.5 MiB vector costs its page faults (and the kernel's zeroing)
// on every round, a fifth of an 80/20 plan's time at 1M tokens. At most 4 buffers are kept; a
// clean one holds only zeros (its size() values), so that it needs no fill.
struct spare_summary {
  std::vector<double> values;
  bool clean = false;
};
// Smaller summaries are neither kept nor served from the pool (a new vector costs them little).
inline constexpr std::size_t pooled_summary_min = 4096;
inline std::vector<spare_summary>& spare_summaries() {
  thread_local std::vector<spare_summary> spare;
  return spare;
}
inline void keep_spare(std::vector<double>&& values, bool clean) {
  std::vector<spare_summary>& spare = spare_summaries();
  if (values.capacity() >= pooled_summary_min && spare.size() < 4) spare.push_back(spare_summary{std::move(values), clean});
  values = std::vector<double>();
}
// n zeros, in the spare buffer that needs the fewest of them written (a clean one at least n long
// needs none; then the smallest), or a new vector if none holds n. Summaries of fewer than 4096
// values (a cut-count round of a small step) take a new vector: they would take a large clean
// buffer's zeros away from the next histogram.
inline std::vector<double> summary_storage(std::size_t n) {
  std::vector<spare_summary>& spare = spare_summaries();
  std::size_t best = spare.size(), best_writes = n;
  auto writes = [n](const spare_summary& b) {
    return b.clean ? (b.values.size() >= n ? 0 : n - b.values.size()) : n;
  };
  for (std::size_t i = 0; i < spare.size() && n >= pooled_summary_min; ++i) {
    if (spare[i].values.capacity() < n) continue;
    const std::size_t w = writes(spare[i]);
    if (best == spare.size() || w < best_writes ||
        (w == best_writes && spare[i].values.capacity() < spare[best].values.capacity())) {
      best = i;
      best_writes = w;
    }
  }
  std::vector<double> v;
  bool clean = false;
  if (best < spare.size()) {
    v = std::move(spare[best].values);
    clean = spare[best].clean;
    spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
  }
  if (clean) v.resize(n);  // its values are zeros; those it grows by are value-initialised
  else v.assign(n, 0.0);
  return v;
}

}  // namespace detail
RECO_NAMESPACE_END
