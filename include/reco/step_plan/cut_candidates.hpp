// The tokens of a part that a cut inside a range of key prefixes may still split (the step plan's
// cut and covariance rounds keep them between rounds, reco/step_plan/part_state.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// The tokens of a part that a cut inside a range of key prefixes may still split: per response,
// the valid tokens above the range, and every valid token inside it (its key and response). The
// rounds after the first narrow the range and count these instead of the part's data.
struct cut_candidates {
  int done = 0;                      // the bits of the prefixes [lo, hi]
  std::uint64_t lo = 1, hi = 0;      // the range of prefixes (empty: nothing gathered)
  std::vector<std::int64_t> above;   // per response of the part: valid tokens above the range
  std::vector<std::uint64_t> keys;   // the valid tokens inside it
  std::vector<index_t> responses;    // ... and their responses (in the part)

  // Empty, for the prefixes [lo, hi] of `done` bits of a part of R responses.
  void reset(int done_now, std::uint64_t lo_now, std::uint64_t hi_now, index_t R) {
    done = done_now;
    lo = lo_now;
    hi = hi_now;
    above.assign(static_cast<std::size_t>(R), 0);
    keys.clear();
    responses.clear();
  }

  // Drops what falls outside [lo, hi] at `done` bits (done >= this->done; a key has `width` bits),
  // counting what lies above.
  void narrow(int width, int done_now, std::uint64_t lo_now, std::uint64_t hi_now) {
    const int s = width - done_now;
    std::size_t k = 0;
    // Without branches: a window of a windowed stage 0 holds many candidates around the few that
    // stay, and which side of the prefixes each lies on is a coin toss for a branch predictor.
    for (std::size_t c = 0; c < keys.size(); ++c) {
      const std::uint64_t p = keys[c] >> s, key = keys[c];
      const index_t r = responses[c];
      above[static_cast<std::size_t>(r)] += p > hi_now;
      keys[k] = key;
      responses[k] = r;
      k += (p >= lo_now) & (p <= hi_now);
    }
    keys.resize(k);
    responses.resize(k);
    done = done_now;
    lo = lo_now;
    hi = hi_now;
  }
};

}  // namespace detail
RECO_NAMESPACE_END
