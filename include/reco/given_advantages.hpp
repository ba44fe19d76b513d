// An objective with its advantage estimator replaced by the caller's advantages (verl and TRL
// compute advantages before the loss): every other component, with its parameters, is kept.
//
//   reco::presets::reco obj;                         // reads rewards and groups
//   auto given = reco::with_given_advantages(obj);   // reads batch.advantages instead
//
// The group offsets still define G for a response weight that reads it (ReCo's 1/(G pbar_old));
// for any other weight one group over the batch will do.
#pragma once

#include "reco/advantage/given.hpp"
#include "reco/objective.hpp"

RECO_NAMESPACE_BEGIN

// The objective type of `Obj` with reco::given_advantage in the advantage slot.
template <class Obj>
using given_advantage_objective_t =
    objective<given_advantage, typename Obj::ratio_type, typename Obj::clip_type, typename Obj::weight_type,
              typename Obj::aggregate_type, typename Obj::selector_type, typename Obj::kl_type,
              typename Obj::entropy_type>;

// A copy of obj's components and parameters around given advantages.
template <class Obj>
given_advantage_objective_t<Obj> with_given_advantages(const Obj& obj) {
  given_advantage_objective_t<Obj> g;
  g.ratio = obj.ratio;
  g.clip = obj.clip;
  g.weight = obj.weight;
  g.aggregate = obj.aggregate;
  g.select = obj.select;
  g.kl = obj.kl;
  g.entropy = obj.entropy;
  return g;
}

RECO_NAMESPACE_END
