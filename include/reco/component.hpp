// The vocabulary every component speaks: role tags and the small structs that carry one
// token's or one response's data into a component's math.
#pragma once

#include <cstdint>

#include "reco/config.hpp"

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

// One token as the per-token components see it (everything already in double).
struct token_context {
  double logp = 0;
  double old_logp = 0;
  double entropy = 0;
  double advantage = 0;
  double sequence_log_ratio = 0;  // per-response value of a sequence-scope ratio
  double entropy_quantile = 0;    // per-response entropy percentile (entropy-split clip)
};

// A clip-compatible ratio at one token.
//  x          the value the clip compares against [1 - eps_low, 1 + eps_high]
//  omega      gradient weight of the unclipped branch: d loss / d logp = -A * omega
//  reciprocal the surrogate's value is -A / rho instead of -A * rho (ASPO's flipped ratio)
//  clipped    the ratio form clipped this token itself (GMPO's log-space clip)
struct ratio_value {
  double x = 1;
  double omega = 1;
  bool reciprocal = false;
  bool clipped = false;
};

// One token's policy-gradient surrogate: its loss, d loss / d logp, and what happened.
struct surrogate_value {
  double loss = 0;
  double grad = 0;
  double x = 1;         // ratio shown in the diagnostics
  bool clipped = false;
  bool dual = false;
};

// A KL estimator at one token: its value and d value / d logp.
struct kl_value {
  double value = 0;
  double grad = 0;
};

// One response as a response weighter sees it.
struct response_context {
  index_t group_size = 0;      // G_g
  index_t length = 0;          // |o_i| (valid tokens)
  double mean_old_logp = 0;    // mean over valid tokens of old_logp (logp when on-policy)
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
