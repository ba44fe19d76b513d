// selectable_clip: the clip policy chosen at run time ("clip.kind" of a composition,
// reco/composition.hpp): none, ppo (with its dual clip) or entropy_split, each with its own
// parameters and math.
#pragma once

#include <cstdint>
#include <string>

#include "reco/clip/entropy_split_clip.hpp"
#include "reco/clip/no_clip.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"

RECO_NAMESPACE_BEGIN

enum class clip_kind : std::uint8_t { none, ppo, entropy_split };
constexpr choice_labels<3> labels_of(clip_kind) { return {{"none", "ppo", "entropy_split"}}; }

namespace detail {
template <class V>
struct clip_apply_op {
  const basic_ratio_value<V>& rv;
  const basic_token_context<V>& c;
  template <class C>
  RECO_TOKEN_MATH basic_surrogate_value<V> operator()(const C& clip) const {
    return clip.apply(rv, c);
  }
};
}  // namespace detail

struct selectable_clip : detail::choice_of<selectable_clip, clip_kind, clip_kind::ppo, no_clip, ppo_clip, entropy_split_clip> {
  using role = roles::clip_policy;
  static constexpr bool selectable = true;
  // The widest properties (entropy quantiles carved); the chosen policy says what runs.
  static constexpr bool needs_entropy = true;
  static constexpr bool needs_entropy_quantile = true;
  static constexpr bool clips = true;

  RECO_HOST_DEVICE bool needs_entropy_now() const { return params.kind == clip_kind::entropy_split; }
  RECO_HOST_DEVICE bool needs_entropy_quantile_now() const { return params.kind == clip_kind::entropy_split; }
  RECO_HOST_DEVICE bool clips_now() const { return params.kind != clip_kind::none; }
  // The entropy percentile of entropy_split (read only when it is chosen).
  RECO_HOST_DEVICE double percentile() const { return alternative<clip_kind::entropy_split>().percentile(); }

  template <class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> apply(const basic_ratio_value<V>& rv, const basic_token_context<V>& c) const {
    return choice_of::apply(detail::clip_apply_op<V>{rv, c});
  }
};

RECO_NAMESPACE_END
