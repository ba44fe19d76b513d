// reco::objective: a policy objective composed from components by policy-based design.
//
//   using my_objective = reco::objective<reco::grpo_advantage, reco::variance_ratio,
//                                        reco::ppo_clip, reco::expected_count_weight,
//                                        reco::seq_mean_token_mean, reco::kl_penalty>;
//   my_objective obj;                      // every component default-constructed
//   obj.clip.params.eps_high = 0.28;       // parameters are plain data
//   reco::workspace<reco::cpu> ws;
//   reco::objective_result res = obj(reco::cpu{}, batch, grads, ws);
//
// Five components are positional (advantage, ratio, clip, weight, aggregation); the optional
// ones (a token selector, a KL term, an entropy term) follow in any order and default to
// all_tokens, no_kl and no_entropy_bonus.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>

#include "reco/algorithm/run_objective.hpp"
#include "reco/workspace.hpp"
#include "reco/advantage/common.hpp"
#include "reco/backend/concept.hpp"
#include "reco/batch.hpp"
#include "reco/clip/no_clip.hpp"
#include "reco/concepts.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/entropy/entropy_bonus.hpp"
#include "reco/entropy/no_entropy_bonus.hpp"
#include "reco/kl/no_kl.hpp"
#include "reco/ratio/token.hpp"
#include "reco/result.hpp"
#include "reco/select/all_tokens.hpp"
#include "reco/select/covariance.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <template <class> class Is, class Default, class... Options>
struct pick_option {
  using type = Default;
};
template <template <class> class Is, class Default, class First, class... Rest>
struct pick_option<Is, Default, First, Rest...> {
  using type = std::conditional_t<Is<First>::value, First, typename pick_option<Is, Default, Rest...>::type>;
};

template <class C> struct is_selector_t : std::bool_constant<is_token_selector_v<C>> {};
template <class C> struct is_kl_t : std::bool_constant<is_kl_term_v<C>> {};
template <class C> struct is_entropy_t : std::bool_constant<is_entropy_term_v<C>> {};

// Components may derive constants from their parameters on the host before a call (prepare()).
template <class C, class = void>
struct has_prepare : std::false_type {};
template <class C>
struct has_prepare<C, std::void_t<decltype(std::declval<C&>().prepare())>> : std::true_type {};
template <class C>
void prepare_component(C& c) {
  if constexpr (has_prepare<C>::value) c.prepare();
}

// The result of a stream-ordered call, copied to the host; throws reco::error for its status.
template <class Backend>
objective_result wait_for_result(const Backend& backend, const objective_result* r) {
  objective_result out;
  backend.copy_to_host(&out, r, 1);
  backend.synchronize();
  throw_if_error(out.status);
  return out;
}

template <template <class> class Is, class... Options>
inline constexpr int count_options = (0 + ... + (Is<Options>::value ? 1 : 0));

}  // namespace detail

// A split step's plan and a part of it (reco/step_plan.hpp); a call with them forwards to
// detail::planned_call (reco/step_plan/call.hpp), so that this header needs none of the plan's.
class step_plan;
struct step_part;
namespace detail {
template <class Plan>
struct planned_call;
template <class Plan>
using if_step_plan = std::enable_if_t<std::is_same_v<Plan, step_plan>, int>;
}  // namespace detail

template <class Advantage, class Ratio, class Clip, class Weight, class Aggregate, class... Options>
class objective {
  static_assert(is_advantage_estimator_v<Advantage>,
                "reco::objective: the 1st component must model advantage_estimator "
                "(reco::grpo_advantage, reco::rloo_advantage, ...)");
  static_assert(is_ratio_form_v<Ratio>,
                "reco::objective: the 2nd component must model ratio_form "
                "(reco::token_ratio, reco::variance_ratio, ...)");
  static_assert(is_clip_policy_v<Clip>,
                "reco::objective: the 3rd component must model clip_policy "
                "(reco::ppo_clip, reco::entropy_split_clip, reco::no_clip)");
  static_assert(is_response_weighter_v<Weight>,
                "reco::objective: the 4th component must model response_weighter "
                "(reco::uniform_weight, reco::expected_count_weight, reco::caller_weight)");
  static_assert(is_loss_aggregator_v<Aggregate>,
                "reco::objective: the 5th component must model loss_aggregator "
                "(reco::token_mean, reco::seq_mean_token_mean, ...)");
  static_assert(((is_token_selector_v<Options> || is_kl_term_v<Options> || is_entropy_term_v<Options>) && ...),
                "reco::objective: an optional component must model token_selector, kl_term or entropy_term");
  static_assert(detail::count_options<detail::is_selector_t, Options...> <= 1,
                "reco::objective: at most one token_selector");
  static_assert(detail::count_options<detail::is_kl_t, Options...> <= 1, "reco::objective: at most one kl_term");
  static_assert(detail::count_options<detail::is_entropy_t, Options...> <= 1,
                "reco::objective: at most one entropy_term");

 public:
  using advantage_type = Advantage;
  using ratio_type = Ratio;
  using clip_type = Clip;
  using weight_type = Weight;
  using aggregate_type = Aggregate;
  using selector_type = typename detail::pick_option<detail::is_selector_t, all_tokens, Options...>::type;
  using kl_type = typename detail::pick_option<detail::is_kl_t, no_kl, Options...>::type;
  using entropy_type = typename detail::pick_option<detail::is_entropy_t, no_entropy_bonus, Options...>::type;

  static_assert(!Ratio::self_clipped || std::is_same_v<Clip, no_clip>,
                "reco::objective: reinforce_ratio, cispo_ratio, sapo_ratio and vespo_ratio carry their own clipping "
                "(or none); compose them with reco::no_clip");

  static_assert(!is_covariance_selection_v<selector_type> || std::is_same_v<Ratio, token_ratio>,
                "reco::objective: covariance_selection (clip_cov / kl_cov) composes with reco::token_ratio");

  // What a call needs from the batch (the objective checks these and names what is missing).
  static constexpr bool needs_rewards = Advantage::input == advantage_input::rewards;
  static constexpr bool needs_advantages = Advantage::input == advantage_input::advantages;
  static constexpr bool needs_ref_logp = kl_type::active;
  static constexpr bool needs_entropy =
      (selector_type::active && !is_covariance_selection_v<selector_type>) || Clip::needs_entropy ||
      entropy_type::active;
  static constexpr bool needs_response_weights = Weight::reads_response_weights;
  static constexpr bool has_entropy_gradient = entropy_type::active;
  // The constants above are what the component types may need; needs() is what this object
  // needs in a call (they agree unless a component is selectable at run time).
  static constexpr bool has_selectable_slot =
      detail::is_selectable_v<Advantage> || detail::is_selectable_v<Ratio> || detail::is_selectable_v<Clip> ||
      detail::is_selectable_v<Weight> || detail::is_selectable_v<selector_type> ||
      detail::is_selectable_v<kl_type> || detail::is_selectable_v<entropy_type>;

  Advantage advantage{};
  Ratio ratio{};
  Clip clip{};
  Weight weight{};
  Aggregate aggregate{};
  selector_type select{};
  kl_type kl{};
  entropy_type entropy{};

  bool kept_denominator() const {
    if constexpr (selector_type::active && !is_covariance_selection_v<selector_type>)
      return detail::term_on(select) && detail::term_of(select).params.denominator == selection_denominator::kept;
    else
      return false;
  }

  // What a call of this objective reads and writes.
  objective_needs needs() const {
    objective_needs n;
    n.rewards = needs_rewards;
    n.advantages = needs_advantages;
    n.ref_logp = detail::term_on(kl);
    bool selects = false;
    if constexpr (!is_covariance_selection_v<selector_type>) selects = detail::term_on(select);
    n.entropy = selects || detail::clip_needs_entropy(clip) || detail::term_on(entropy);
    n.response_weights = detail::reads_response_weights(weight);
    n.entropy_gradient = detail::term_on(entropy);
    n.group_size = detail::reads_group_size(weight);
    return n;
  }

  // A copy with every component's derived constants computed (what the algorithms receive).
  objective prepared() const {
    objective o = *this;
    detail::prepare_component(o.advantage);
    detail::prepare_component(o.ratio);
    detail::prepare_component(o.clip);
    detail::prepare_component(o.weight);
    detail::prepare_component(o.aggregate);
    detail::prepare_component(o.select);
    detail::prepare_component(o.kl);
    detail::prepare_component(o.entropy);
    return o;
  }

  // Throws reco::error naming the first parameter out of range ("clip.params.eps_low", ...).
  void validate() const {
    if constexpr (detail::is_selectable_v<Ratio>) {
      // The static check of fixed components, made on the chosen ones.
      bool clips = false;
      if constexpr (detail::is_selectable_v<Clip>) clips = clip.clips_now();
      else clips = !std::is_same_v<Clip, no_clip>;
      if (ratio.self_clips() && clips)
        detail::fail("clip.kind", "must be none: the chosen ratio form carries its own clipping (or none)");
    }
    detail::validate_component(advantage, "advantage");
    detail::validate_component(ratio, "ratio");
    detail::validate_component(clip, "clip");
    detail::validate_component(weight, "weight");
    detail::validate_component(aggregate, "aggregate");
    detail::validate_component(select, "select");
    detail::validate_component(kl, "kl");
    detail::validate_component(entropy, "entropy");
  }

  // The checks every call makes before it runs (both run overloads): the parameters, the batch's
  // sizes and required inputs, and on host-accessible backends its offsets; throws reco::error
  // naming the argument.
  template <class Backend, class T>
  void check_call(const Backend&, const batch_view<T>& batch, const gradients<T>& grads,
                  const normalisers& norm) const {
    static_assert(check_backend<Backend>(), "reco::objective: the backend must provide reco/backend/concept.hpp");
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "reco::objective: per-token values must be float or double");
    static_assert(!is_covariance_selection_v<selector_type> || detail::runs_host_selections_v<Backend>,
                  "reco::objective: covariance_selection (clip_cov / kl_cov) selects in host memory: it runs on "
                  "host-accessible backends (reco::cpu)");
    validate();
    detail::validate_batch(batch, grads, norm, needs());
    if constexpr (Backend::host_accessible) detail::validate_offsets_host(batch);
    detail::validate_rollout_logp(batch, detail::weight_reads_rollout_logp(weight), Backend::host_accessible);
    detail::validate_token_advantages(batch, Backend::host_accessible);
  }

  // Stream-ordered call: returns a pointer to the result in the backend's memory (device memory
  // for reco::cuda; valid until the workspace's next use). Structural errors (sizes, missing
  // inputs, parameters) throw at once; errors found in the data are reported in result->status
  // on a device backend and thrown on the CPU backend.
  template <class Backend, class T>
  const objective_result* run(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              workspace<Backend>& ws, const normalisers& norm = {}) const {
    check_call(backend, batch, grads, norm);
    return objective_algorithm<Backend, objective>::run(prepared(), backend, batch, grads, ws, norm);
  }

  // Synchronous call: the result on the host; throws reco::error for any input error.
  template <class Backend, class T>
  objective_result operator()(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              workspace<Backend>& ws, const normalisers& norm = {}) const {
    return detail::wait_for_result(backend, run(backend, batch, grads, ws, norm));
  }

  // A call of a split step: this part's share of the step's loss and gradient under the step's
  // plan (reco/step_plan/call.hpp, where it is defined).
  template <class Backend, class T, class Plan, detail::if_step_plan<Plan> = 0>
  const objective_result* run(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              workspace<Backend>& ws, const Plan& plan, const step_part& part) const {
    return detail::planned_call<Plan>::run(*this, backend, batch, grads, ws, plan, part);
  }
  template <class Backend, class T, class Plan, detail::if_step_plan<Plan> = 0>
  objective_result operator()(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              workspace<Backend>& ws, const Plan& plan, const step_part& part) const {
    return detail::wait_for_result(backend, run(backend, batch, grads, ws, plan, part));
  }
  template <class Backend, class T, class Plan, detail::if_step_plan<Plan> = 0>
  objective_result operator()(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              const Plan& plan, const step_part& part) const {
    workspace<Backend> ws;
    return (*this)(backend, batch, grads, ws, plan, part);
  }

  // Convenience for one-off host calls: a temporary workspace.
  template <class Backend, class T>
  objective_result operator()(const Backend& backend, const batch_view<T>& batch, gradients<T> grads,
                              const normalisers& norm = {}) const {
    workspace<Backend> ws;
    return (*this)(backend, batch, grads, ws, norm);
  }
};

RECO_NAMESPACE_END
