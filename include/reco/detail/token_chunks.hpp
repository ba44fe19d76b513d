// Chunks of mask_chunk tokens, as the host passes over a part's tokens read them: whether a
// chunk's mask is all zero, its flags as the bits of one word, and prefetches ahead of the read;
// and the positions of an evenly spaced sample of the tokens.
#pragma once

#include <cstdint>
#include <cstring>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Tokens go in chunks of this many; a chunk whose mask is all zero is skipped by the passes.
inline constexpr index_t mask_chunk = 64;

// Sample j of S evenly spaced over N tokens: the middle of its N / S slots.
inline index_t sample_position(index_t j, index_t N, index_t S) {
  return static_cast<index_t>((2 * static_cast<double>(j) + 1) * static_cast<double>(N) / (2.0 * S));
}

// Whether none of the n <= mask_chunk mask bytes at m is set (8 bytes at a time).
inline bool chunk_masked(const std::uint8_t* m, index_t n) {
  std::uint64_t any = 0;
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    std::uint64_t w;
    std::memcpy(&w, m + j, 8);
    any |= w;
  }
  for (; j < n; ++j) any |= m[j];
  return any == 0;
}

// n <= mask_chunk flags of 0 or 1 at in, as the bits of one word (flag j to bit j).
inline std::uint64_t flag_bits(const std::uint8_t* in, index_t n) {
  std::uint64_t bits = 0;
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    std::uint64_t w;
    std::memcpy(&w, in + j, 8);
    bits |= ((w * 0x0102040810204080ull) >> 56) << j;  // byte k's 0/1 to bit k
  }
  for (; j < n; ++j) bits |= static_cast<std::uint64_t>(in[j]) << j;
  return bits;
}

// Asks for the mask_chunk entropies of T at address h and, when m is not 0, the mask line at m
// (addresses as integers: past the end they are only prefetched, never read).
template <class T>
inline void prefetch_chunk_lines(std::uintptr_t h, std::uintptr_t m) {
#if defined(__GNUC__)
  constexpr std::uintptr_t line = 64;
  for (std::uintptr_t x = h; x < h + sizeof(T) * mask_chunk; x += line) __builtin_prefetch(reinterpret_cast<const void*>(x));
  if (m) __builtin_prefetch(reinterpret_cast<const void*>(m));
#else
  (void)h;
  (void)m;
#endif
}
// Asks for the cache lines of the chunk of mask_chunk tokens that starts 4 KiB after h (its
// entropies) and m (its mask bytes, when given). The passes read each token once, most often from
// memory (the call before them evicted it), and between the chunks they read they skip masked
// chunks and count keys, which the hardware prefetcher does not follow far enough ahead: on cold
// data (512 x 1024 slots, Zen 3 guest) the first-digit pass took 0.92 ms without this and 0.67
// with it (0.42 on cached data). Addresses past the end are computed as integers and only
// prefetched, never read.
template <class T>
inline void prefetch_chunk_ahead(const T* h, const std::uint8_t* m) {
  constexpr std::uintptr_t ahead = 4096;
  prefetch_chunk_lines<T>(reinterpret_cast<std::uintptr_t>(h) + ahead, m ? reinterpret_cast<std::uintptr_t>(m) + ahead : 0);
}
// The same for the chunk `tokens` slots after h and m (the sample's next chunks but some: its
// stride leaves the hardware prefetcher nothing to follow).
template <class T>
inline void prefetch_chunk_at(const T* h, const std::uint8_t* m, index_t tokens) {
  const auto t = static_cast<std::uintptr_t>(tokens);
  prefetch_chunk_lines<T>(reinterpret_cast<std::uintptr_t>(h) + sizeof(T) * t, m ? reinterpret_cast<std::uintptr_t>(m) + t : 0);
}

}  // namespace detail
RECO_NAMESPACE_END
