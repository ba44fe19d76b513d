// Views over a batch of R responses to P prompts: the token layout, the per-token and
// per-response inputs, the gradient outputs and the optional global normalisers.
#pragma once

#include <cstdint>

#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

enum class layout_kind : std::uint8_t {
  padded,  // response i owns tokens [i*T, (i+1)*T) of a row-major [R, T] array
  packed,  // response i owns tokens [offsets[i], offsets[i+1]) (cu_seqlens style)
};

// Where each response's tokens live. Built with reco::padded(R, T) or reco::packed(offsets).
// Every accessor clamps into [0, tokens) so that a malformed offsets array can never make a
// kernel read out of bounds; malformed offsets are reported as an input error instead.
struct token_layout {
  layout_kind kind = layout_kind::padded;
  index_t responses = 0;         // R
  index_t max_length = 0;        // T (padded layout only)
  span<const index_t> offsets;   // R + 1 entries (packed layout only)
  index_t tokens = 0;            // N: the length of every per-token array

  RECO_HOST_DEVICE index_t begin(index_t i) const {
    if (kind == layout_kind::padded) return i * max_length;
    const index_t b = offsets[i];
    return b < 0 ? 0 : (b > tokens ? tokens : b);
  }
  RECO_HOST_DEVICE index_t end(index_t i) const {
    if (kind == layout_kind::padded) return (i + 1) * max_length;
    const index_t b = begin(i);
    const index_t e = offsets[i + 1];
    return e < b ? b : (e > tokens ? tokens : e);
  }
  // The response that owns token t (t in [0, tokens)).
  RECO_HOST_DEVICE index_t response_of(index_t t) const {
    if (kind == layout_kind::padded) return max_length > 0 ? t / max_length : 0;
    // Last i with offsets[i] <= t: a binary search over the R + 1 offsets.
    index_t lo = 0, hi = responses;  // answer in [lo, hi)
    while (hi - lo > 1) {
      const index_t mid = lo + (hi - lo) / 2;
      if (offsets[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
  }
};

inline token_layout padded(index_t responses, index_t max_length) {
  token_layout l;
  l.kind = layout_kind::padded;
  l.responses = responses;
  l.max_length = max_length;
  l.tokens = responses * max_length;
  return l;
}

// offsets has R + 1 entries, offsets[0] == 0, non-decreasing, offsets[R] == N.
inline token_layout packed(span<const index_t> offsets) {
  token_layout l;
  l.kind = layout_kind::packed;
  l.responses = offsets.size() > 0 ? offsets.size() - 1 : 0;
  l.offsets = offsets;
  return l;
}

// Everything one objective call reads. Per-token arrays have N = layout.tokens entries;
// per-response arrays have R. An empty span means "not supplied"; which inputs are required
// depends on the components (the objective checks and names the missing one).
template <class T>
struct batch_view {
  token_layout layout;
  span<const index_t> group_offsets;  // P + 1 entries over responses; groups are contiguous

  span<const T> logp;              // log pi_theta of each sampled token (required)
  span<const T> old_logp;          // policy that sampled the batch; empty = on-policy (= logp)
  span<const T> ref_logp;          // reference policy, for a KL term
  span<const T> entropy;           // entropy of the current policy per position
  span<const std::uint8_t> mask;   // nonzero = valid token; empty = every token in range valid
  span<const T> token_weights;     // optional rollout importance weights (policy term only)

  span<const T> rewards;           // per response, for estimators that read rewards
  span<const T> advantages;        // per response, for reco::given_advantage
  // per token instead of `advantages` (GAE, token baselines), for reco::given_advantage: A_t
  // replaces the response's A_i in every per-token term (at most one of the two is given)
  span<const T> token_advantages;
  span<const T> response_weights;  // per response, for reco::caller_weight
  // log-probs of the rollout policy (the inference engine) that sampled the batch; read only by
  // an expected-count weight with weight.sampling = rollout (given otherwise: an error)
  span<const T> rollout_logp;
};

// Where the objective writes d loss / d logp (and d loss / d entropy when an entropy term is
// on). Masked and padding tokens receive exactly 0.
template <class T>
struct gradients {
  span<T> logp;
  span<T> entropy;
};

// Global normalisers for data-parallel training and gradient accumulation: set the counts of
// the whole (global) batch so that the loss does not depend on how the batch is split.
// 0 means "count locally". "kept" counts are the tokens and responses left by a token
// selector whose denominator is the kept tokens.
struct normalisers {
  index_t tokens = 0;          // valid tokens in the global batch
  index_t responses = 0;       // non-empty responses in the global batch
  index_t kept_tokens = 0;     // selected tokens in the global batch
  index_t kept_responses = 0;  // responses with at least one selected token
};

RECO_NAMESPACE_END
