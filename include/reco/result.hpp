// What one objective call returns: the loss and its parts, the diagnostics of docs/conventions.md
// ("Diagnostics")
// and a status word for input errors found while reading device-resident data.
#pragma once

#include <cstdint>
#include <string>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN

// Token-level means are over valid tokens unless named otherwise; "policy tokens" are the valid
// tokens that the token selector kept (all valid tokens without a selector). A CPU call with
// reco::cpu::diagnostics = false leaves the token diagnostics (clip and dual fractions, ppo_kl,
// the ratio's mean / min / max, the entropy means, token_variance) at 0.
struct diagnostics {
  double clip_frac = 0;        // policy tokens in a clipped branch
  double clip_frac_low = 0;    // ... with A < 0 (ratio below 1 - eps_low)
  double clip_frac_high = 0;   // ... with A > 0 (ratio above 1 + eps_high)
  double dual_clip_frac = 0;   // policy tokens where the (hard or soft) dual clip fired
  double ppo_kl = 0;           // mean(old_logp - logp) over policy tokens
  double ratio_mean = 0;       // the value the clip sees, over policy tokens
  double ratio_min = 0;
  double ratio_max = 0;
  double ref_kl_mean = 0;      // mean KL estimator value over valid tokens (KL term on)
  double entropy_mean = 0;     // over valid tokens (entropy supplied)
  double entropy_kept_mean = 0;  // over policy tokens (entropy supplied)
  double kept_frac = 0;        // policy tokens / valid tokens
  double weight_mean = 0;      // response weights over non-empty responses
  double weight_min = 0;
  double weight_max = 0;
  index_t weight_cap_hits = 0;  // responses whose weight hit the cap
  double zero_std_group_frac = 0;  // groups whose rewards are all equal (singletons included)
  double advantage_mean = 0;   // token-weighted over valid tokens
  double advantage_std = 0;    // token-weighted population std over valid tokens
  double token_variance[3] = {0, 0, 0};  // mean p(1-p) in the early/middle/late third
  index_t valid_tokens = 0;
  index_t policy_tokens = 0;
  index_t nonempty_responses = 0;
};

struct objective_result {
  double loss = 0;          // policy + kl + entropy
  double policy_loss = 0;   // aggregated policy-gradient surrogate (weights included)
  double kl_loss = 0;       // beta * aggregate(kl)
  double entropy_loss = 0;  // -coef * aggregate(entropy)
  diagnostics stats;
  std::uint32_t status = 0;  // 0 = ok; otherwise input_error bits (see describe_status)
  // Always 0. It fills what would be padding, so that every byte of a result is written and two
  // results compare bit for bit (a device copy of a struct may leave padding as the memory was).
  std::uint32_t reserved = 0;
};

// Input errors that can only be detected by reading the data (which may live on the device).
enum input_error : std::uint32_t {
  bad_token_offsets = 1u << 0,
  bad_group_offsets = 1u << 1,
  bad_logp = 1u << 2,
  bad_old_logp = 1u << 3,
  bad_ref_logp = 1u << 4,
  bad_entropy = 1u << 5,
  bad_rewards = 1u << 6,
  bad_advantages = 1u << 7,
  bad_response_weights = 1u << 8,
  bad_token_weights = 1u << 9,
  singleton_group = 1u << 10,
  bad_normaliser_tokens = 1u << 11,
  bad_normaliser_responses = 1u << 12,
  bad_normaliser_kept_tokens = 1u << 13,
  bad_normaliser_kept_responses = 1u << 14,
  weight_overflow = 1u << 15,
  // A call of a split step (reco/step_plan.hpp) on data other than the plan was built from.
  plan_length_mismatch = 1u << 16,
  plan_kept_mismatch = 1u << 17,
  // Values only a step plan's summaries check (the call checks them eagerly, by position).
  bad_token_advantages = 1u << 18,
  bad_rollout_logp = 1u << 19,
  // A step plan's part that could not be summarised on its rank (reco::torch::build_step_plan).
  bad_part_input = 1u << 20,
};

namespace detail {
struct status_entry {
  std::uint32_t bit;
  const char* argument;
  const char* what;
};
inline constexpr status_entry status_table[] = {
    {bad_token_offsets, "batch.layout.offsets",
     "offsets must start at 0, never decrease and end at the number of tokens"},
    {bad_group_offsets, "batch.group_offsets",
     "offsets must start at 0, never decrease and end at the number of responses"},
    {bad_logp, "batch.logp", "a valid token is NaN, infinite or positive (log-probabilities must be <= 0)"},
    {bad_old_logp, "batch.old_logp", "a valid token is NaN, infinite or positive (log-probabilities must be <= 0)"},
    {bad_ref_logp, "batch.ref_logp", "a valid token is NaN, infinite or positive (log-probabilities must be <= 0)"},
    {bad_entropy, "batch.entropy", "NaN or infinite value in a valid token"},
    {bad_rewards, "batch.rewards", "NaN or infinite reward"},
    {bad_advantages, "batch.advantages", "NaN or infinite advantage"},
    {bad_response_weights, "batch.response_weights", "NaN, infinite or negative weight"},
    {bad_token_weights, "batch.token_weights", "NaN, infinite or negative weight in a valid token"},
    {bad_token_advantages, "batch.token_advantages", "a valid token's advantage is NaN or infinite"},
    {bad_rollout_logp, "batch.rollout_logp", "a valid token is NaN, infinite or positive (log-probabilities must be <= 0)"},
    {bad_part_input, "micro_batches",
     "a micro-batch failed its checks on one of the ranks (that rank's error names the argument); every rank "
     "stops at this step's summaries"},
    {singleton_group, "batch.group_offsets",
     "a group has a single response and the estimator's singleton policy is 'error'"},
    {bad_normaliser_tokens, "normalisers.tokens",
     "global count below this call's valid tokens (a global count covers every part of the step)"},
    {bad_normaliser_responses, "normalisers.responses",
     "global count below this call's non-empty responses (a global count covers every part of the step)"},
    {bad_normaliser_kept_tokens, "normalisers.kept_tokens",
     "global count below this call's selected tokens (a global count covers every part of the step)"},
    {bad_normaliser_kept_responses, "normalisers.kept_responses",
     "global count below this call's responses with a selected token (a global count covers every part "
     "of the step)"},
    {weight_overflow, "batch.old_logp",
     "an expected-count weight exp(-log G - mean old_logp) exceeds the double range (mean old_logp "
     "below about -709); turn the weight cap or a weight normalisation on"},
    {plan_length_mismatch, "plan",
     "does not match this call's data: a response's valid-token count differs from the one the plan "
     "counted (a plan from another step or part?)"},
    {plan_kept_mismatch, "plan",
     "keeps another number of tokens of a response than this call's entropies do: the entropies differ "
     "from those the plan was built with"},
};
}  // namespace detail

namespace detail {
// weight_overflow when the expected-count weight averaged batch.rollout_logp (weight.sampling =
// rollout): the status table names old_logp, the input of the default weight.
inline constexpr const char* rollout_weight_overflow =
    "an expected-count weight exp(-log G - mean rollout_logp) exceeds the double range (mean rollout_logp "
    "below about -709); turn the weight cap or a weight normalisation on";
}  // namespace detail

// The first error in a status word, as the argument it names and a sentence.
inline std::string describe_status(std::uint32_t status) {
  for (const auto& e : detail::status_table)
    if (status & e.bit) return std::string(e.argument) + ": " + e.what;
  return "ok";
}

// Throws reco::error naming the argument when status is not 0.
inline void throw_if_error(std::uint32_t status) {
  for (const auto& e : detail::status_table)
    if (status & e.bit) throw error(e.argument, e.what);
}

RECO_NAMESPACE_END
