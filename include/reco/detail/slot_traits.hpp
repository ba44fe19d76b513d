// What a component does in this call, read the same way for a fixed component and for one whose
// choice is made at run time (the selectable_* components, reco/composition.hpp).
//
// A fixed component states its properties as constants (kl_penalty::active, ratio scope, ...);
// the algorithm branches on them at compile time. A selectable component declares
// `static constexpr bool selectable = true`, states the widest properties as its constants (so
// that every pass its alternatives may need is compiled and its scratch carved) and answers for
// the chosen alternative through member functions. The helpers below give the algorithm one
// spelling for both: for a fixed component they are constants, so its code is unchanged.
#pragma once

#include <type_traits>

#include "reco/advantage/common.hpp"
#include "reco/component.hpp"
#include "reco/config.hpp"
#include "reco/objective_needs.hpp"
#include "reco/weight/common.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class C, class = void>
struct is_selectable : std::false_type {};
template <class C>
struct is_selectable<C, std::void_t<decltype(C::selectable)>> : std::bool_constant<C::selectable> {};
template <class C>
inline constexpr bool is_selectable_v = is_selectable<C>::value;

// An optional term (token selector, KL term, entropy term): whether it is on in this call.
template <class C>
RECO_HOST_DEVICE constexpr bool term_on(const C& c) {
  if constexpr (!C::active) {
    return false;
  } else if constexpr (is_selectable_v<C>) {
    return c.on();
  } else {
    (void)c;
    return true;
  }
}

// Whether the ratio form needs its per-response sequence value (ratio_scope::sequence).
template <class R>
RECO_HOST_DEVICE constexpr bool sequence_scoped(const R& r) {
  if constexpr (is_selectable_v<R>) return r.sequence_scoped();
  else return (void)r, R::scope == ratio_scope::sequence;
}

// A sequence-scope form's per-response value from the sum of its sequence terms.
template <class R>
RECO_HOST_DEVICE double sequence_value_of(const R& r, double sum, index_t n) {
  if constexpr (is_selectable_v<R>) return r.sequence_value(sum, n);
  else return (void)r, sequence_value<R>(sum, n);
}

// Whether the clip policy reads per-response entropy quantiles (entropy_split_clip).
template <class C>
RECO_HOST_DEVICE constexpr bool needs_entropy_quantile(const C& c) {
  if constexpr (is_selectable_v<C>) return c.needs_entropy_quantile_now();
  else return (void)c, C::needs_entropy_quantile;
}
template <class C>
RECO_HOST_DEVICE constexpr bool clip_needs_entropy(const C& c) {
  if constexpr (is_selectable_v<C>) return c.needs_entropy_now();
  else return (void)c, C::needs_entropy;
}

// The weighter's inputs.
template <class W>
constexpr bool reads_response_weights(const W& w) {
  if constexpr (is_selectable_v<W>) return w.reads_response_weights_now();
  else return (void)w, W::reads_response_weights;
}
template <class W>
constexpr bool reads_group_size(const W& w) {
  if constexpr (is_selectable_v<W>) return w.reads_group_size_now();
  else return (void)w, weight_reads_group_size<W>::value;
}
template <class W>
constexpr bool needs_old_mean(const W& w) {
  if constexpr (is_selectable_v<W>) return w.needs_old_mean_now();
  else return (void)w, weight_needs_old_mean<W>::value;
}

// The estimator's batch stage.
template <class A>
constexpr advantage_batch_stage batch_stage_of(const A& a) {
  if constexpr (is_selectable_v<A>) return a.batch_stage_now();
  else return (void)a, A::batch_stage;
}

// The fixed term inside an optional slot: a selectable term holds it in params.term (and says
// with on() whether it runs), a fixed term is itself.
template <class C>
RECO_HOST_DEVICE constexpr const auto& term_of(const C& c) {
  if constexpr (is_selectable_v<C>) return c.params.term;
  else return c;
}

}  // namespace detail
RECO_NAMESPACE_END
