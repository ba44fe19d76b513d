// Role checks for components: C++17 traits (and C++20 concepts with the same names when the
// compiler has them). reco::objective uses them to reject a misplaced type with a message that
// names the role instead of a page of template errors.
#pragma once

#include <type_traits>
#include <utility>

#include "reco/component.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class C, class Role, class = void>
struct declares_role : std::false_type {};
template <class C, class Role>
struct declares_role<C, Role, std::void_t<typename C::role>> : std::is_same<typename C::role, Role> {};

template <class C, class = void>
struct has_clip_apply : std::false_type {};
template <class C>
struct has_clip_apply<C, std::void_t<decltype(std::declval<const C&>().apply(
                             std::declval<const ratio_value&>(), std::declval<const token_context&>()))>>
    : std::is_same<decltype(std::declval<const C&>().apply(std::declval<const ratio_value&>(),
                                                           std::declval<const token_context&>())),
                   surrogate_value> {};

template <class C, class = void>
struct has_ratio_eval : std::false_type {};
template <class C>
struct has_ratio_eval<C, std::void_t<decltype(std::declval<const C&>().eval(std::declval<const token_context&>()))>>
    : std::true_type {};

template <class C, class = void>
struct has_ratio_surrogate : std::false_type {};
template <class C>
struct has_ratio_surrogate<
    C, std::void_t<decltype(std::declval<const C&>().surrogate(std::declval<const token_context&>()))>>
    : std::true_type {};

// Stands for a clip policy in the check below (never defined or called).
struct no_clip_probe {
  template <class V>
  basic_surrogate_value<V> apply(const basic_ratio_value<V>&, const basic_token_context<V>&) const;
};
// A ratio form selectable at run time computes the surrogate with the clip slot (surrogate_with).
template <class C, class = void>
struct has_selectable_surrogate : std::false_type {};
template <class C>
struct has_selectable_surrogate<C, std::void_t<decltype(std::declval<const C&>().surrogate_with(
                                       std::declval<const no_clip_probe&>(), std::declval<const token_context&>()))>>
    : std::true_type {};

template <class C, class = void>
struct has_advantage_members : std::false_type {};
template <class C>
struct has_advantage_members<
    C, std::void_t<decltype(C::input), decltype(C::batch_stage),
                   decltype(std::declval<const C&>().finalize(0.0, std::declval<const advantage_batch_stats&>()))>>
    : std::true_type {};

template <class C, class = void>
struct has_weight_members : std::false_type {};
template <class C>
struct has_weight_members<C, std::void_t<decltype(std::declval<const C&>().raw(std::declval<const response_context&>())),
                                         decltype(std::declval<const C&>().cap()),
                                         decltype(std::declval<const C&>().normalisation())>>
    : std::true_type {};

template <class C, class = void>
struct has_coefficient : std::false_type {};
template <class C>
struct has_coefficient<C, std::void_t<decltype(std::declval<const C&>().coefficient(
                              std::declval<const aggregation_counts&>(), index_t{}))>> : std::true_type {};

template <class C, class = void>
struct has_active_flag : std::false_type {};
template <class C>
struct has_active_flag<C, std::void_t<decltype(C::active)>> : std::true_type {};

}  // namespace detail

template <class C>
inline constexpr bool is_advantage_estimator_v =
    detail::declares_role<C, roles::advantage_estimator>::value && detail::has_advantage_members<C>::value;
template <class C>
inline constexpr bool is_ratio_form_v =
    detail::declares_role<C, roles::ratio_form>::value &&
    (detail::has_ratio_eval<C>::value || detail::has_ratio_surrogate<C>::value ||
     detail::has_selectable_surrogate<C>::value);
template <class C>
inline constexpr bool is_clip_policy_v =
    detail::declares_role<C, roles::clip_policy>::value && detail::has_clip_apply<C>::value;
template <class C>
inline constexpr bool is_response_weighter_v =
    detail::declares_role<C, roles::response_weighter>::value && detail::has_weight_members<C>::value;
template <class C>
inline constexpr bool is_loss_aggregator_v =
    detail::declares_role<C, roles::loss_aggregator>::value && detail::has_coefficient<C>::value;
template <class C>
inline constexpr bool is_token_selector_v =
    detail::declares_role<C, roles::token_selector>::value && detail::has_active_flag<C>::value;
template <class C>
inline constexpr bool is_kl_term_v = detail::declares_role<C, roles::kl_term>::value && detail::has_active_flag<C>::value;
template <class C>
inline constexpr bool is_entropy_term_v =
    detail::declares_role<C, roles::entropy_term>::value && detail::has_active_flag<C>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
template <class C> concept advantage_estimator = is_advantage_estimator_v<C>;
template <class C> concept ratio_form = is_ratio_form_v<C>;
template <class C> concept clip_policy = is_clip_policy_v<C>;
template <class C> concept response_weighter = is_response_weighter_v<C>;
template <class C> concept loss_aggregator = is_loss_aggregator_v<C>;
template <class C> concept token_selector = is_token_selector_v<C>;
template <class C> concept kl_term = is_kl_term_v<C>;
template <class C> concept entropy_term = is_entropy_term_v<C>;
#endif

RECO_NAMESPACE_END
