// A part's token passes run by the caller where its tokens are (a GPU): part_token_source, the
// reductions it returns (part_token_sums), and the choice between it and the host passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/batch.hpp"
#include "reco/result.hpp"
#include "reco/step_plan/cut_candidates.hpp"
#include "reco/step_plan/host_passes.hpp"

RECO_NAMESPACE_BEGIN
// What the plan's passes find in a part's tokens, computed by the caller where the tokens are (a
// part_token_source): per response of the part, its valid tokens and the sum over them of what
// the weight averages (asked for when the plan reads it: old_logp, logp when on-policy); the
// input_error bits of the values read (bad_old_logp or bad_logp for the averaged values,
// bad_entropy for a non-finite valid entropy of a selection); the first-digit histogram of the
// valid entropies' order-preserving keys (asked for with a cut to find: digit_histogram_size
// counts, digit 0 empty, then the sums of each run of 256 digits).
struct part_token_sums {
  std::vector<index_t> valid;
  std::vector<double> old_sum;
  std::uint32_t status = 0;
  std::vector<double> histogram;
};

// A part's token passes run by the caller instead of on the host's copy of its data: every step
// of the plan that reads tokens (summarize, gather_early, plan_round) takes one and then reads no
// per-token pointer of the batch (its per-response inputs and layout still come from the batch).
// Each function must return what the host pass of the same name does on the same data (the
// reductions may round differently: old_sum in another order).
struct part_token_source {
  // old_mean: the sums of the averaged values are wanted; entropy: the selection's entropies are
  // checked; histogram: the first-digit histogram is wanted.
  std::function<void(bool old_mean, bool entropy, bool histogram, part_token_sums&)> sums;
  // detail::gather_candidates: the candidates under the key prefixes [lo, hi] of `done` bits.
  std::function<void(int done, std::uint64_t lo, std::uint64_t hi, detail::cut_candidates&)> gather;
  // detail::count_cut: per response, the valid tokens above and on the cut.
  std::function<void(double cut, std::int64_t* above, std::int64_t* on)> count_cut;
};

namespace detail {

// The host passes over a part's tokens, or the caller's where the tokens are.
template <class T>
void gather_part(const batch_pointers<T>& b, int done, std::uint64_t lo, std::uint64_t hi, cut_candidates& out,
                 const part_token_source* tokens) {
  if (!tokens) return gather_candidates(b, done, lo, hi, out);
  out.reset(done, lo, hi, b.layout.responses);
  tokens->gather(done, lo, hi, out);
  require(out.above.size() == static_cast<std::size_t>(b.layout.responses) && out.keys.size() == out.responses.size(),
          "tokens", "gathered cut candidates of the wrong size");
}
// A covariance selection's plan reads each part's logp on the host: no part_token_source.
inline void refuse_token_source(const part_token_source* tokens) {
  if (tokens) fail("tokens", "a covariance selection's plan reads the part's logp on the host (CPU tensors)");
}

}  // namespace detail
RECO_NAMESPACE_END
