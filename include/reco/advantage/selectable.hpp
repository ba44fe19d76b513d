// selectable_advantage: the advantage estimator chosen at run time ("advantage.kind" of a
// composition, reco/composition.hpp) among the estimators that read rewards, each with its own
// parameters. (Given advantages replace the slot with reco::given_advantage, as for a preset.)
#pragma once

#include <cstdint>
#include <string>

#include "reco/advantage/batch_std.hpp"
#include "reco/advantage/dr_grpo.hpp"
#include "reco/advantage/gpg.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/advantage/opo.hpp"
#include "reco/advantage/pass_at_k.hpp"
#include "reco/advantage/reinforce_pp.hpp"
#include "reco/advantage/rloo.hpp"
#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"

RECO_NAMESPACE_BEGIN

enum class advantage_kind : std::uint8_t { grpo, dr_grpo, rloo, opo, batch_std, gpg, reinforce_pp, pass_at_k };
constexpr choice_labels<8> labels_of(advantage_kind) {
  return {{"grpo", "dr_grpo", "rloo", "opo", "batch_std", "gpg", "reinforce_pp", "pass_at_k"}};
}

namespace detail {
template <class T>
struct advantage_group_op {
  const group_input<T>& g;
  double* out;
  std::uint32_t& status;
  template <class A>
  RECO_HOST_DEVICE int operator()(const A& a) const {
    a.group(g, out, status);
    return 0;
  }
};
struct advantage_finalize_op {
  double a;
  const advantage_batch_stats& s;
  template <class A>
  RECO_HOST_DEVICE double operator()(const A& est) const {
    return est.finalize(a, s);
  }
};
struct advantage_stage_op {
  template <class A>
  RECO_HOST_DEVICE advantage_batch_stage operator()(const A&) const {
    return A::batch_stage;
  }
};
}  // namespace detail

struct selectable_advantage
    : detail::choice_of<selectable_advantage, advantage_kind, advantage_kind::grpo, grpo_advantage, dr_grpo_advantage,
                        rloo_advantage, opo_advantage, batch_std_advantage, gpg_advantage, reinforce_pp_advantage,
                        pass_at_k_advantage> {
  using role = roles::advantage_estimator;
  static constexpr bool selectable = true;
  static constexpr advantage_input input = advantage_input::rewards;
  // The batch stage is the chosen estimator's (batch_stage_now); the algorithm reads it through
  // detail::batch_stage_of.
  static constexpr advantage_batch_stage batch_stage = advantage_batch_stage::token_whiten;

  RECO_HOST_DEVICE advantage_batch_stage batch_stage_now() const { return apply(detail::advantage_stage_op{}); }
  template <class T>
  RECO_HOST_DEVICE void group(const group_input<T>& g, double* out, std::uint32_t& status) const {
    apply(detail::advantage_group_op<T>{g, out, status});
  }
  RECO_HOST_DEVICE double finalize(double a, const advantage_batch_stats& s) const {
    return apply(detail::advantage_finalize_op{a, s});
  }
};

RECO_NAMESPACE_END
