// What an objective type reads besides logp and old_logp, and whether it writes an entropy
// gradient, as plain flags: the adapters check a caller's inputs against them and name a missing
// argument before any work starts.
#pragma once

#include <type_traits>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN

// Whether a response weighter reads the group size G (declares `reads_group_size = true`).
template <class W, class = void>
struct weight_reads_group_size : std::false_type {};
template <class W>
struct weight_reads_group_size<W, std::void_t<decltype(W::reads_group_size)>>
    : std::bool_constant<W::reads_group_size> {};

struct objective_needs {
  bool rewards = false;
  bool advantages = false;
  bool ref_logp = false;
  bool entropy = false;
  bool response_weights = false;
  bool entropy_gradient = false;  // d loss / d entropy is written (an entropy term is on)
  bool group_size = false;        // the response weight reads G (group offsets or a group size)
};

// What an objective type reads (a fixed composition: every call alike). An objective with a
// component selectable at run time answers per object: needs_of(obj).
template <class Objective>
constexpr objective_needs needs_of() {
  static_assert(!Objective::has_selectable_slot,
                "reco::needs_of<Objective>(): a component is selectable at run time; use needs_of(obj)");
  objective_needs n;
  n.rewards = Objective::needs_rewards;
  n.advantages = Objective::needs_advantages;
  n.ref_logp = Objective::needs_ref_logp;
  n.entropy = Objective::needs_entropy;
  n.response_weights = Objective::needs_response_weights;
  n.entropy_gradient = Objective::has_entropy_gradient;
  n.group_size = weight_reads_group_size<typename Objective::weight_type>::value;
  return n;
}

// What this objective object reads (its selectable components as chosen).
template <class Objective>
objective_needs needs_of(const Objective& obj) {
  return obj.needs();
}

RECO_NAMESPACE_END
