// What a backend is: the primitives the generic algorithm (reco/algorithm/run_objective.hpp) and
// the workspace are written against, stated once. reco::objective::run checks them with
// check_backend<B>(), so a type that lacks one fails with a message naming the primitive instead
// of deep inside a pass. reco::cpu (reco/backend/cpu.hpp) and reco::cuda (reco/backend/cuda.cuh)
// model it; docs/backends.md describes each primitive's contract.
//
//   static constexpr bool host_accessible        the backend's memory is the host's
//   scratch_state, with_scratch(state*, resource*) -> B, static release_scratch(state&)
//                                                a workspace's growable scratch, bound per call
//   allocate(bytes) -> void*, deallocate(p, bytes), static release_at_end(p, bytes)
//   for_work(tokens) -> B                        the backend tuned for a call of that size
//   for_each(n, f)                               f(i) for every i in [0, n)
//   reduce(n, f, merge, out)                     *out = f(0) merged with ... f(n - 1), fixed order
//   reduce_tokens(layout, f, merge, out)         f(i, t) once per token t of response i, merged
//   order_statistics(keys, n, ranks, m, out)     out[j] = the ranks[j]-th smallest key (keys reordered)
//   segmented_sort(keys, layout)                 keys sorted ascending within each response
//   exclusive_scan(n, f, out)                    out[i] = f(0) + ... + f(i - 1), out[n] = the total
//   copy_to_host(dst, src, n), synchronize()     results back on the host
// Optional: packs_tokens<F>() -> bool, whether reduce_tokens runs the token pass F on packs; where
// it does, that pass also computes a capped, unnormalised response weight (token_fn::weighs).
//
// Functors passed to a backend are namespace-scope types whose operator() is RECO_HOST_DEVICE.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Stand-in functors: a primitive is checked by its declaration only (never instantiated).
struct probe_value {
  static probe_value merge(const probe_value&, const probe_value&) { return {}; }
};
struct probe_index_fn {
  RECO_HOST_DEVICE void operator()(index_t) const {}
};
struct probe_partial_fn {
  RECO_HOST_DEVICE probe_value operator()(index_t) const { return {}; }
};
struct probe_token_fn {
  RECO_HOST_DEVICE probe_value operator()(index_t, index_t) const { return {}; }
};
struct probe_merge_fn {
  RECO_HOST_DEVICE probe_value operator()(const probe_value&, const probe_value&) const { return {}; }
};
struct probe_count_fn {
  RECO_HOST_DEVICE index_t operator()(index_t) const { return 0; }
};

#define RECO_BACKEND_PRIMITIVE(name, ...)         \
  template <class B, class = void>                \
  struct backend_has_##name : std::false_type {}; \
  template <class B>                              \
  struct backend_has_##name<B, std::void_t<decltype(__VA_ARGS__)>> : std::true_type {};

RECO_BACKEND_PRIMITIVE(host_accessible, std::integral_constant<bool, B::host_accessible>{})
RECO_BACKEND_PRIMITIVE(scratch, std::declval<const B&>().with_scratch(
                                    std::declval<typename B::scratch_state*>(), std::declval<memory_resource*>()))
RECO_BACKEND_PRIMITIVE(release_scratch, B::release_scratch(std::declval<typename B::scratch_state&>()))
RECO_BACKEND_PRIMITIVE(memory, (std::declval<const B&>().deallocate(std::declval<const B&>().allocate(std::size_t{}),
                                                                    std::size_t{}),
                                B::release_at_end(nullptr, std::size_t{})))
RECO_BACKEND_PRIMITIVE(for_work, std::declval<const B&>().for_work(index_t{}))
RECO_BACKEND_PRIMITIVE(for_each, std::declval<const B&>().for_each(index_t{}, probe_index_fn{}))
RECO_BACKEND_PRIMITIVE(reduce, std::declval<const B&>().reduce(index_t{}, probe_partial_fn{}, probe_merge_fn{},
                                                               std::declval<probe_value*>()))
RECO_BACKEND_PRIMITIVE(reduce_tokens,
                       std::declval<const B&>().reduce_tokens(std::declval<const token_layout&>(), probe_token_fn{},
                                                              probe_merge_fn{}, std::declval<probe_value*>()))
RECO_BACKEND_PRIMITIVE(order_statistics,
                       std::declval<const B&>().order_statistics(std::declval<double*>(), index_t{},
                                                                 std::declval<const index_t*>(), int{},
                                                                 std::declval<double*>()))
RECO_BACKEND_PRIMITIVE(segmented_sort, std::declval<const B&>().segmented_sort(std::declval<double*>(),
                                                                               std::declval<const token_layout&>()))
RECO_BACKEND_PRIMITIVE(exclusive_scan, std::declval<const B&>().exclusive_scan(index_t{}, probe_count_fn{},
                                                                               std::declval<index_t*>()))
RECO_BACKEND_PRIMITIVE(host_copies, (std::declval<const B&>().copy_to_host(std::declval<double*>(),
                                                                           std::declval<const double*>(), index_t{}),
                                     std::declval<const B&>().synchronize()))
#undef RECO_BACKEND_PRIMITIVE

// Whether objective::run takes a step plan on backend B: host-accessible backends, and those that
// declare `static constexpr bool takes_step_plans = true` (reco::cuda_fused copies the plan's slice).
template <class B, class = void>
struct takes_step_plans : std::bool_constant<B::host_accessible> {};
template <class B>
struct takes_step_plans<B, std::void_t<decltype(B::takes_step_plans)>>
    : std::bool_constant<B::host_accessible || B::takes_step_plans> {};
template <class B>
inline constexpr bool takes_step_plans_v = takes_step_plans<B>::value;

// Whether backend B runs the selections made in host memory (Clip-Cov / KL-Cov rank the call's
// tokens on the host with its final advantages): host-accessible backends. A covariance
// objective on another backend is refused at compile time (objective::check_call).
template <class B>
inline constexpr bool runs_host_selections_v = B::host_accessible;

// Whether backend B says if it runs a token pass F on packs (the optional packs_tokens<F>() above):
// the generic algorithm then lets that pass compute the response weights (token_fn::weighs).
template <class B, class F, class = void>
struct has_packs_tokens : std::false_type {};
template <class B, class F>
struct has_packs_tokens<B, F, std::void_t<decltype(std::declval<const B&>().template packs_tokens<F>())>>
    : std::true_type {};
}  // namespace detail

// Whether B provides every primitive above.
template <class B>
inline constexpr bool is_backend_v =
    detail::backend_has_host_accessible<B>::value && detail::backend_has_scratch<B>::value &&
    detail::backend_has_release_scratch<B>::value && detail::backend_has_memory<B>::value &&
    detail::backend_has_for_work<B>::value && detail::backend_has_for_each<B>::value &&
    detail::backend_has_reduce<B>::value && detail::backend_has_reduce_tokens<B>::value &&
    detail::backend_has_order_statistics<B>::value && detail::backend_has_segmented_sort<B>::value &&
    detail::backend_has_exclusive_scan<B>::value && detail::backend_has_host_copies<B>::value;

// One static_assert per primitive, so the message names what is missing.
template <class B>
constexpr bool check_backend() {
  static_assert(detail::backend_has_host_accessible<B>::value,
                "reco backend: needs `static constexpr bool host_accessible` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_scratch<B>::value && detail::backend_has_release_scratch<B>::value,
                "reco backend: needs `scratch_state`, `with_scratch(scratch_state*, memory_resource*)` and "
                "`static release_scratch(scratch_state&)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_memory<B>::value,
                "reco backend: needs `allocate(bytes)`, `deallocate(p, bytes)` and `static release_at_end(p, bytes)` "
                "(reco/backend/concept.hpp)");
  static_assert(detail::backend_has_for_work<B>::value,
                "reco backend: needs `for_work(index_t tokens)` returning the backend (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_for_each<B>::value,
                "reco backend: needs `for_each(n, f)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_reduce<B>::value,
                "reco backend: needs `reduce(n, f, merge, out)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_reduce_tokens<B>::value,
                "reco backend: needs `reduce_tokens(layout, f, merge, out)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_order_statistics<B>::value,
                "reco backend: needs `order_statistics(keys, n, ranks, m, out)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_segmented_sort<B>::value,
                "reco backend: needs `segmented_sort(keys, layout)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_exclusive_scan<B>::value,
                "reco backend: needs `exclusive_scan(n, f, out)` (reco/backend/concept.hpp)");
  static_assert(detail::backend_has_host_copies<B>::value,
                "reco backend: needs `copy_to_host(dst, src, n)` and `synchronize()` (reco/backend/concept.hpp)");
  return true;
}

RECO_NAMESPACE_END
