// selectable_ratio: the ratio form chosen at run time among the library's ten ("ratio.kind" of a
// composition, reco/composition.hpp), each alternative with its own parameters and its own math.
// A form that carries its own clipping (reinforce, cispo, sapo, vespo, dppo) computes the
// surrogate alone and requires the clip slot "none", as the fixed objective's static check does.
#pragma once

#include <cstdint>
#include <string>

#include "reco/component.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/ratio/cispo.hpp"
#include "reco/ratio/dppo.hpp"
#include "reco/ratio/flipped.hpp"
#include "reco/ratio/gmpo.hpp"
#include "reco/ratio/reinforce.hpp"
#include "reco/ratio/sapo.hpp"
#include "reco/ratio/sequence.hpp"
#include "reco/ratio/token.hpp"
#include "reco/ratio/variance.hpp"
#include "reco/ratio/vespo.hpp"

RECO_NAMESPACE_BEGIN

enum class ratio_kind : std::uint8_t { token, sequence, variance, flipped, reinforce, cispo, sapo, gmpo, vespo, dppo };
constexpr choice_labels<10> labels_of(ratio_kind) {
  return {{"token", "sequence", "variance", "flipped", "reinforce", "cispo", "sapo", "gmpo", "vespo", "dppo"}};
}

namespace detail {
// The two halves of a token's surrogate: a self-clipped form computes it alone; any other gives
// its ratio value, which then goes through the clip slot once (not once per ratio form).
template <class V>
struct self_surrogate_op {
  const basic_token_context<V>& c;
  template <class R>
  RECO_TOKEN_MATH basic_surrogate_value<V> operator()(const R& r) const {
    if constexpr (R::self_clipped) return r.surrogate(c);
    else return (void)r, basic_surrogate_value<V>{};
  }
};
template <class V>
struct ratio_eval_op {
  const basic_token_context<V>& c;
  template <class R>
  RECO_TOKEN_MATH basic_ratio_value<V> operator()(const R& r) const {
    if constexpr (R::self_clipped) return (void)r, basic_ratio_value<V>{};
    else return r.eval(c);
  }
};
struct sequence_term_op {
  const token_context& c;
  template <class R>
  RECO_TOKEN_MATH double operator()(const R& r) const {
    if constexpr (R::scope == ratio_scope::sequence) return r.sequence_term(c);
    else return (void)r, 0.0;
  }
};
struct sequence_value_op {
  double sum;
  index_t n;
  template <class R>
  RECO_TOKEN_MATH double operator()(const R&) const {
    return sequence_value<R>(sum, n);
  }
};
struct ratio_scope_op {
  template <class R>
  RECO_TOKEN_MATH bool operator()(const R&) const {
    return R::scope == ratio_scope::sequence;
  }
};
struct self_clipped_op {
  template <class R>
  RECO_TOKEN_MATH bool operator()(const R&) const {
    return R::self_clipped;
  }
};
}  // namespace detail

struct selectable_ratio
    : detail::choice_of<selectable_ratio, ratio_kind, ratio_kind::token, token_ratio, sequence_ratio, variance_ratio,
                        flipped_ratio, reinforce_ratio, cispo_ratio, sapo_ratio, gmpo_ratio, vespo_ratio, dppo_ratio> {
  using role = roles::ratio_form;
  static constexpr bool selectable = true;
  // The widest properties: the sequence pass and its scratch exist; the chosen form says whether
  // they run (sequence_scoped) and whether the clip slot takes part (self_clips).
  static constexpr ratio_scope scope = ratio_scope::sequence;
  static constexpr bool self_clipped = false;

  RECO_HOST_DEVICE bool sequence_scoped() const { return apply(detail::ratio_scope_op{}); }
  RECO_HOST_DEVICE bool self_clips() const { return apply(detail::self_clipped_op{}); }
  RECO_HOST_DEVICE double sequence_term(const token_context& c) const { return apply(detail::sequence_term_op{c}); }
  RECO_HOST_DEVICE double sequence_value(double sum, index_t n) const {
    return apply(detail::sequence_value_op{sum, n});
  }
  // The surrogate of one token (or pack): the chosen form alone, or its ratio through the clip.
  template <class Clip, class V>
  RECO_TOKEN_MATH basic_surrogate_value<V> surrogate_with(const Clip& clip, const basic_token_context<V>& c) const {
    if (self_clips()) return apply(detail::self_surrogate_op<V>{c});
    return clip.apply(apply(detail::ratio_eval_op<V>{c}), c);
  }
};

RECO_NAMESPACE_END
