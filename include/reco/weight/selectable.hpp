// selectable_weight: the response weighter chosen at run time ("weight.kind" of a composition,
// reco/composition.hpp): uniform, expected_count (ReCo's 1 / (G pbar_old)) or caller (the
// batch's response_weights), each with its own parameters.
#pragma once

#include <cstdint>
#include <string>

#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/objective_needs.hpp"
#include "reco/weight/caller_weight.hpp"
#include "reco/weight/expected_count.hpp"
#include "reco/weight/uniform.hpp"

RECO_NAMESPACE_BEGIN

enum class weight_kind : std::uint8_t { uniform, expected_count, caller };
constexpr choice_labels<3> labels_of(weight_kind) { return {{"uniform", "expected_count", "caller"}}; }

namespace detail {
struct weight_raw_op {
  const response_context& r;
  template <class W>
  RECO_HOST_DEVICE double operator()(const W& w) const {
    return w.raw(r);
  }
};
struct weight_log_raw_op {
  const response_context& r;
  template <class W>
  RECO_HOST_DEVICE double operator()(const W& w) const {
    return log_raw_weight(w, r);
  }
};
struct weight_cap_op {
  template <class W>
  RECO_HOST_DEVICE double operator()(const W& w) const {
    return w.cap();
  }
};
struct weight_normalisation_op {
  template <class W>
  RECO_HOST_DEVICE weight_normalisation operator()(const W& w) const {
    return w.normalisation();
  }
};
}  // namespace detail

struct selectable_weight : detail::choice_of<selectable_weight, weight_kind, weight_kind::uniform, uniform_weight,
                                            expected_count_weight, caller_weight> {
  using role = roles::response_weighter;
  static constexpr bool selectable = true;
  // The widest properties; the *_now members answer for the chosen weighter.
  static constexpr bool needs_old_logp_mean = true;
  static constexpr bool reads_response_weights = true;
  static constexpr bool is_uniform = false;
  static constexpr bool reads_group_size = true;

  bool needs_old_mean_now() const { return params.kind == weight_kind::expected_count; }
  bool reads_response_weights_now() const { return params.kind == weight_kind::caller; }
  bool reads_group_size_now() const { return params.kind == weight_kind::expected_count; }
  bool reads_rollout_logp() const {
    return params.kind == weight_kind::expected_count && alternative<weight_kind::expected_count>().reads_rollout_logp();
  }

  RECO_HOST_DEVICE double raw(const response_context& r) const { return apply(detail::weight_raw_op{r}); }
  RECO_HOST_DEVICE double log_raw(const response_context& r) const { return apply(detail::weight_log_raw_op{r}); }
  RECO_HOST_DEVICE double cap() const { return apply(detail::weight_cap_op{}); }
  RECO_HOST_DEVICE weight_normalisation normalisation() const { return apply(detail::weight_normalisation_op{}); }
};

RECO_NAMESPACE_END
