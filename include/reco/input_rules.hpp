// Which of a call's optional inputs an objective reads, which it requires and which it refuses
// as unread, keyed by what it needs (objective_needs): one table for the core's checks
// (reco/validate.hpp), the LibTorch adapter and the raw CUDA adapter. Each names the input by its
// own argument ("batch.rewards", "rewards", "args.rewards") and says why with the table's words.
#pragma once

#include <cstdint>
#include <string>

#include "reco/config.hpp"
#include "reco/objective_needs.hpp"

RECO_NAMESPACE_BEGIN

// The inputs whose presence depends on the objective (logp is always required, old_logp, the mask
// and token weights are always optional).
enum class call_input : std::uint8_t {
  rewards,
  advantages,        // given, one per response
  token_advantages,  // given, one per token
  ref_logp,
  entropy,
  response_weights,
  grad_entropy,      // an output: d loss / d entropy
};

struct input_rule {
  call_input input;
  const char* name;               // the input's own name; the core's argument is "batch." + name
  bool objective_needs::*reads;   // the need under which the objective reads it
  bool required;                  // ... and requires it (when the batch has responses or tokens)
  const char* required_by;        // what requires it
  // Why an objective without that need does not read it (after the objective's name: "preset
  // 'grpo' computes advantages from rewards"); nullptr: accepted and not read (entropy feeds
  // diagnostics; the adapters check an unread ref_logp's values).
  const char* unread;
};

inline constexpr input_rule input_rules[] = {
    {call_input::rewards, "rewards", &objective_needs::rewards, true, "the advantage estimator",
     " takes its advantages from the advantages input (reco::given_advantage)"},
    {call_input::advantages, "advantages", &objective_needs::advantages, true,
     "reco::given_advantage (or token_advantages, one per token)", " computes advantages from rewards"},
    {call_input::token_advantages, "token_advantages", &objective_needs::advantages, false,
     "reco::given_advantage", " computes advantages from rewards"},
    {call_input::ref_logp, "ref_logp", &objective_needs::ref_logp, true, "the KL term", nullptr},
    {call_input::entropy, "entropy", &objective_needs::entropy, true,
     "the token selector, the entropy-split clip or the entropy bonus", nullptr},
    {call_input::response_weights, "response_weights", &objective_needs::response_weights, true,
     "reco::caller_weight", " does not weight responses by a given weight (only reco::caller_weight does)"},
    {call_input::grad_entropy, "grad_entropy", &objective_needs::entropy_gradient, true,
     "the entropy term (its gradient flows into the entropy)", nullptr},
};

inline constexpr bool input_rules_in_order() {
  for (int k = 0; k < static_cast<int>(sizeof(input_rules) / sizeof(input_rules[0])); ++k)
    if (static_cast<int>(input_rules[k].input) != k) return false;
  return true;
}
static_assert(input_rules_in_order(), "reco::input_rules: one entry per call_input, in its order");

inline constexpr const input_rule& rule_of(call_input in) { return input_rules[static_cast<int>(in)]; }

// Whether an objective with needs `n` reads / requires the input.
inline bool reads_input(const objective_needs& n, call_input in) { return n.*(rule_of(in).reads); }
inline bool requires_input(const objective_needs& n, call_input in) {
  const input_rule& r = rule_of(in);
  return r.required && n.*(r.reads);
}
// Whether it refuses the input when given (unread, and not accepted for diagnostics).
inline bool refuses_input(const objective_needs& n, call_input in) {
  return rule_of(in).unread != nullptr && !reads_input(n, in);
}

// The messages that follow the argument's name; `who` (optional) names the objective.
inline std::string required_message(call_input in, const std::string& who = "") {
  return std::string("is required by ") + rule_of(in).required_by + (who.empty() ? "" : " of " + who);
}
// `who` names the objective ("preset 'grpo'", "this objective").
inline std::string unread_message(call_input in, const std::string& who) {
  return who + rule_of(in).unread + "; it does not read this input";
}

RECO_NAMESPACE_END
