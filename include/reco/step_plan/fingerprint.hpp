// The fingerprint of a split step's objective (plan_fingerprint): the objective's type, its
// components' parameters, the step and the value width, hashed so that every part of a step and
// every call with its plan can be checked to agree on them. Parameters are read through the
// fields each component declares for the registry (fields()), the same list a key names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <typeinfo>

#include "reco/config.hpp"
#include "reco/detail/one_of.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/result.hpp"
#include "reco/select/covariance.hpp"
#include "reco/step_plan/step.hpp"
#include "reco/step_plan/summary.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}
// A scalar by value (its bytes: a double, a bool, an enumeration or an integer has no padding).
template <class S>
std::uint64_t fnv_value(std::uint64_t h, const S& v) {
  static_assert(std::is_scalar_v<S>, "reco::step_plan: only scalars are hashed");
  return fnv(h, &v, sizeof(S));
}

// Hashes each field a component declares (its key and its value).
struct fingerprint_fields {
  std::uint64_t* h;
  template <class S>
  void operator()(const char* key, S& v) const {
    *h = fnv(*h, key, std::strlen(key));
    *h = fnv_value(*h, v);
  }
};
// A selectable slot's fields are those of its chosen alternative (or of its term while on): the
// choice itself is hashed beside them.
template <class P, class = void>
struct has_kind_field : std::false_type {};
template <class P>
struct has_kind_field<P, std::void_t<decltype(std::declval<const P&>().kind)>> : std::true_type {};
template <class P, class = void>
struct has_on_field : std::false_type {};
template <class P>
struct has_on_field<P, std::void_t<decltype(std::declval<const P&>().on)>> : std::true_type {};

template <class C>
std::uint64_t hash_component(std::uint64_t h, const C& c) {
  if constexpr (has_field_list<C>::value) {
    C copy = c;  // fields() visits mutable parameters
    fingerprint_fields v{&h};
    visit_component_fields(copy, v);
    using P = typename C::params_type;
    if constexpr (has_kind_field<P>::value) h = fnv_value(h, c.params.kind);
    if constexpr (has_on_field<P>::value) h = fnv_value(h, c.params.on);
  }
  return h;
}

// The fingerprint of (objective type and parameters, step, value width): every part of a step and
// every call with its plan must agree on it.
template <class Obj>
std::uint64_t plan_fingerprint(const Obj& obj, const step_info& step, std::size_t width) {
  std::uint64_t h = 1469598103934665603ull;
  // The objective type itself (a preset derives from it and is the same objective).
  using base = std::decay_t<decltype(obj.prepared())>;
  const char* name = typeid(base).name();
  h = fnv(h, name, std::strlen(name));
  h = fnv_value(h, step.id);
  h = fnv_value(h, step.responses);
  h = fnv_value(h, step.scale);
  h = fnv_value(h, step.config);
  h = fnv_value(h, width);
  h = hash_component(h, obj.advantage);
  h = hash_component(h, obj.ratio);
  h = hash_component(h, obj.clip);
  h = hash_component(h, obj.weight);
  h = hash_component(h, obj.aggregate);
  h = hash_component(h, obj.select);
  h = hash_component(h, obj.kl);
  h = hash_component(h, obj.entropy);
  // An 80/20 cut given by the caller is no key field, yet decides the plan.
  if constexpr (!is_covariance_selection_v<typename Obj::selector_type> && Obj::selector_type::active) {
    if (term_on(obj.select)) {
      const auto& p = term_of(obj.select).params;
      h = fnv_value(h, p.use_given);
      h = fnv_value(h, p.given.value);
      h = fnv_value(h, p.given.ties);
    }
  }
  return h;
}

// The header of a summed stage-0 summary whose parts agree: their number, value width and
// fingerprint, which must be that of `step` and the objective (else fails naming `argument`).
struct summed_head {
  double parts = 0;
  std::size_t width = 0;
  std::uint64_t fp = 0;
};
template <class Obj>
summed_head stage0_head(const Obj& obj, const step_summary& s, const step_info& step, const char* argument,
                        const char* mismatch) {
  summed_head h;
  check_plan_header(s, 0, h.fp, false);
  h.parts = s.values[plan_h_parts];
  h.width = static_cast<std::size_t>(s.values[plan_h_width] / h.parts);
  if (plan_fingerprint(obj, step, h.width) != h.fp) fail(argument, mismatch);
  return h;
}

}  // namespace detail
RECO_NAMESPACE_END
