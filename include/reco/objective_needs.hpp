// What an objective type reads besides logp and old_logp, and whether it writes an entropy
// gradient, as plain flags: the adapters check a caller's inputs against them and name a missing
// argument before any work starts.
#pragma once

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN

struct objective_needs {
  bool rewards = false;
  bool advantages = false;
  bool ref_logp = false;
  bool entropy = false;
  bool response_weights = false;
  bool entropy_gradient = false;  // d loss / d entropy is written (an entropy term is on)
};

template <class Objective>
constexpr objective_needs needs_of() {
  objective_needs n;
  n.rewards = Objective::needs_rewards;
  n.advantages = Objective::needs_advantages;
  n.ref_logp = Objective::needs_ref_logp;
  n.entropy = Objective::needs_entropy;
  n.response_weights = Objective::needs_response_weights;
  n.entropy_gradient = Objective::has_entropy_gradient;
  return n;
}

RECO_NAMESPACE_END
