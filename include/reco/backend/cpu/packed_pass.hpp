// The CPU backend's vectorised form of a generic pass. The generic algorithm's passes
// (reco/algorithm/) are written token by token, for every backend; where a pass has a form on
// SIMD packs (reco/backend/cpu/simd.hpp), the header beside this one that holds it specialises
// packed_pass for the pass's functor type, and reco::cpu calls that form instead when its
// `vectorise` flag is on:
//   for_each:       packed_pass<F>::run(f, i)                          (the response scan)
//   reduce_tokens:  packed_pass<F>::accumulate_chunk(f, acc, i, t0, t1)  (the token pass: a chunk of
//                   tokens [t0, t1), its first token in response i)
// A pass without a specialisation (and every pass where RECO_SIMD is 0) runs its own loop.
#pragma once

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class F>
struct packed_pass {
  static constexpr bool available = false;
};

}  // namespace detail
RECO_NAMESPACE_END
