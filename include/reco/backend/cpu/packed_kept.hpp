// The CPU backend's vectorised form of the 80/20 rule's kept flags and counts per response
// (reco/algorithm/select_tokens.hpp: kept_response_fn): the same flags and counts, the loops
// compiled for the widest instruction set the process runs. A float cut that a float holds (top_k's
// is a token's value) compares in float: the same answers as in double, at one width.
#pragma once

#include <cstdint>
#include <type_traits>

#include "reco/algorithm/select_tokens.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/simd.hpp"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Locals throughout: a store through a byte pointer may alias what the references name, which
// the loops would then reload per token instead of vectorising.
template <class T, class C>
struct kept_loops {
  template <int W>
  static void run(const T* const& values, const std::uint8_t* const& mask, const index_t& n, const C& cut,
                  const bool& split, std::uint8_t* const& kept, index_t& count, index_t& on_cut) {
    const T* const v = values;
    const std::uint8_t* const m = mask;
    std::uint8_t* const out = kept;
    const index_t len = n;
    const C c = cut;
    std::int32_t k = 0, equal = 0;  // a response holds fewer than 2^31 tokens
    if (!split) {
      if (m == nullptr) {
        for (index_t t = 0; t < len; ++t) k += out[t] = static_cast<C>(v[t]) >= c;
      } else {
        for (index_t t = 0; t < len; ++t) k += out[t] = (m[t] != 0) & (static_cast<C>(v[t]) >= c);
      }
    } else if (m == nullptr) {
      for (index_t t = 0; t < len; ++t) {
        k += out[t] = static_cast<C>(v[t]) > c;
        equal += static_cast<C>(v[t]) == c;
      }
    } else {
      for (index_t t = 0; t < len; ++t) {
        const bool valid = m[t] != 0;
        k += out[t] = valid & (static_cast<C>(v[t]) > c);
        equal += valid & (static_cast<C>(v[t]) == c);
      }
    }
    count = k;
    on_cut = equal;
  }
};

template <class T>
struct packed_pass<kept_response_fn<T>> {
  static constexpr bool available = true;
  static void run(const kept_response_fn<T>& f, index_t i) {
    const index_t b = f.layout.begin(i), e = f.layout.end(i);
    if constexpr (std::is_same_v<T, float>) {
      const auto cut_f = static_cast<float>(f.cut);
      if (static_cast<double>(cut_f) == f.cut) {
        loops<float>(f, i, b, e, cut_f);
        return;
      }
    }
    loops<double>(f, i, b, e, f.cut);
  }
  template <class C>
  static void loops(const kept_response_fn<T>& f, index_t i, index_t b, index_t e, C cut) {
    // A response is too short a stream for the hardware prefetcher to run ahead: the next
    // responses' lines, 4 KiB of values ahead.
    for (index_t t = b; t < e; t += 64 / sizeof(T)) {
      __builtin_prefetch(f.values + t + 4096 / sizeof(T));
      if (f.mask && (t - b) % 64 < static_cast<index_t>(64 / sizeof(T))) __builtin_prefetch(f.mask + t + 1024);
    }
    const T* v = f.values + b;
    const std::uint8_t* m = f.mask ? f.mask + b : nullptr;
    std::uint8_t* out = f.kept + b;
    const index_t n = e - b;
    const bool split = f.on_cut != nullptr;
    index_t k = 0, equal = 0;
    simd::run_widest_loops<kept_loops<T, C>>(v, m, n, cut, split, out, k, equal);
    f.count[i] = k;
    if (split) f.on_cut[i] = equal;
  }
};

}  // namespace detail
RECO_NAMESPACE_END
