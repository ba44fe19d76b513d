// The "last block" ticket of the fused kernels. Every block of a fused kernel writes its partial
// sums to its own slot, then takes a ticket; the block that takes the last one merges all slots
// in block order (so the result does not depend on which block finished first) and writes the
// scalars the next stage reads. No host synchronisation, no float atomics, no memset.
//
// The ticket word lives in the workspace, whose memory may hold anything on the first call (or
// after another user of the same workspace). So the word carries a call tag (epoch) in its high
// 40 bits and the arrival count in its low 24 bits: a block that finds another epoch starts the
// count afresh. The host draws a new epoch for every call; a CUDA graph replays the epoch it
// captured, which is why the last block leaves the word at (epoch, 0) for the next replay.
// The transition is a pure function so that the protocol is tested on the host.
#pragma once

#include <atomic>
#include <cstdint>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

inline constexpr int ticket_count_bits = 24;
inline constexpr std::uint64_t ticket_count_mask = (std::uint64_t(1) << ticket_count_bits) - 1;
inline constexpr std::uint64_t ticket_epoch_mask = (std::uint64_t(1) << (64 - ticket_count_bits)) - 1;

// The word after one more arrival of a block of call `epoch`.
RECO_HOST_DEVICE inline std::uint64_t ticket_next(std::uint64_t current, std::uint64_t epoch) {
  const std::uint64_t tag = epoch << ticket_count_bits;
  return (current >> ticket_count_bits) == epoch ? current + 1 : (tag | 1u);
}
RECO_HOST_DEVICE inline std::uint64_t ticket_count(std::uint64_t word) { return word & ticket_count_mask; }
// The word the last block leaves behind: same epoch, no arrivals.
RECO_HOST_DEVICE inline std::uint64_t ticket_reset(std::uint64_t epoch) { return epoch << ticket_count_bits; }

// A fresh epoch per call, process-wide; never 0 (zeroed memory then never looks like a live call).
inline std::uint64_t next_epoch() {
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t e = (counter.fetch_add(1, std::memory_order_relaxed) + 1) & ticket_epoch_mask;
  return e == 0 ? 1 : e;
}

}  // namespace fused
RECO_NAMESPACE_END
