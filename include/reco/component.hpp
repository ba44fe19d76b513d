// The vocabulary every component speaks: role tags and the small structs that carry one
// token's or one response's data into a component's math.
#pragma once

#include <cstdint>
#include <type_traits>

#include "reco/config.hpp"
#include "reco/detail/math.hpp"

RECO_NAMESPACE_BEGIN

// Each component declares `using role = reco::roles::<its role>;`.
namespace roles {
struct advantage_estimator {};
struct ratio_form {};
struct clip_policy {};
struct response_weighter {};
struct loss_aggregator {};
struct token_selector {};
struct kl_term {};
struct entropy_term {};
}  // namespace roles

// Where a ratio form lives: token ratios are computed per token; sequence ratios need one
// per-response reduction over the response's tokens first.
enum class ratio_scope : std::uint8_t { token, sequence };

namespace detail {
// A sequence-scope ratio form's per-response value: the mean of its sequence_term over the
// response's valid tokens, or their sum where the form declares `static constexpr bool
// sequence_sum = true` (VESPO's weight is a product of token ratios, not a geometric mean).
template <class R, class = void>
struct sequence_sums : std::false_type {};
template <class R>
struct sequence_sums<R, std::void_t<decltype(R::sequence_sum)>> : std::bool_constant<R::sequence_sum> {};

template <class R>
RECO_HOST_DEVICE inline double sequence_value(double sum, index_t n) {
  if (n <= 0) return 0.0;
  return sequence_sums<R>::value ? sum : sum / static_cast<double>(n);
}
}  // namespace detail

// What a group-scope advantage estimator sees: the rewards and valid-token counts of the G
// responses of one prompt (contiguous in the batch).
template <class T>
struct group_input {
  index_t size = 0;
  const T* rewards = nullptr;
  const index_t* lengths = nullptr;
};

// Batch-wide statistics an estimator may ask for in its finalize step.
struct advantage_batch_stats {
  double reward_count = 0;     // responses in the batch
  double reward_mean = 0;
  double reward_var = 0;       // unbiased
  double nonzero_rewards = 0;  // responses with s != 0
  double token_count = 0;      // valid tokens in the batch
  double token_mean = 0;       // token-weighted mean of the group-stage values
  double token_var_unbiased = 0;
  double token_var_biased = 0;
};

// The labels of an enumeration's values, in order. An enumeration used as a parameter declares
// them beside itself, found by argument-dependent lookup:
//   constexpr choice_labels<3> labels_of(dual_clip_mode) { return {{"off", "hard", "soft"}}; }
// Keys set a choice by its index and errors list the labels (reco/registry.hpp).
template <int N>
struct choice_labels {
  const char* names[N];
  static constexpr int size = N;
};

// One token as the per-token components see it (everything already in double). The math is
// written over V (reco/detail/math.hpp): V = double is one token; the CPU backend's vectorised
// pass uses a pack of tokens of one response, so the per-response fields stay scalars.
template <class V>
struct basic_token_context {
  V logp = V(0.0);
  V old_logp = V(0.0);
  V entropy = V(0.0);
  double advantage = 0;
  double sequence_log_ratio = 0;  // per-response value of a sequence-scope ratio
  double entropy_quantile = 0;    // per-response entropy percentile (entropy-split clip)
  // p (1 - p) of logp, p = exp(logp), as bernoulli_variance at floor 0 gives it (0 on lanes
  // outside the valid tokens), where the loop has computed it already (for its token-variance
  // diagnostic, set_logp_variance): a ratio form that needs it reads it instead of computing it.
  V logp_variance = V(0.0);
  bool has_logp_variance = false;
};
using token_context = basic_token_context<double>;

// A clip-compatible ratio at one token.
//  x          the value the clip compares against [1 - eps_low, 1 + eps_high]
//  omega      gradient weight of the unclipped branch: d loss / d logp = -A * omega
//  reciprocal the surrogate's value is -A / rho instead of -A * rho (ASPO's flipped ratio; a
//             per-response choice)
//  clipped    the ratio form clipped this token itself (GMPO's log-space clip)
template <class V>
struct basic_ratio_value {
  V x = V(1.0);
  V omega = V(1.0);
  bool reciprocal = false;
  detail::mask_t<V> clipped = false;
};
using ratio_value = basic_ratio_value<double>;

// One token's policy-gradient surrogate: its loss, d loss / d logp, and what happened.
template <class V>
struct basic_surrogate_value {
  V loss = V(0.0);
  V grad = V(0.0);
  V x = V(1.0);  // ratio shown in the diagnostics
  detail::mask_t<V> clipped = false;
  detail::mask_t<V> dual = false;
};
using surrogate_value = basic_surrogate_value<double>;

// A KL estimator at one token: its value and d value / d logp.
template <class V>
struct basic_kl_value {
  V value = V(0.0);
  V grad = V(0.0);
};
using kl_value = basic_kl_value<double>;

// One response as a response weighter sees it.
struct response_context {
  index_t group_size = 0;      // G_g
  index_t length = 0;          // |o_i| (valid tokens)
  double mean_old_logp = 0;    // mean of old_logp over valid tokens (logp on-policy; rollout_logp: weight.sampling)
  double given_weight = 1;     // batch.response_weights[i] when supplied
};

// Counts an aggregator normalises by (local, or global when the caller passes normalisers).
struct aggregation_counts {
  double tokens = 0;      // N
  double responses = 0;   // R' (responses with at least one token in the term's mask)
  double all_responses = 0;  // R (every response, empty ones included)
  double max_length = 0;  // padded T, or the longest response span in a packed batch
};

RECO_NAMESPACE_END
