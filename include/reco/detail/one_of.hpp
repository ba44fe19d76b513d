// one_of<A...>: every alternative of a slot, each with its own parameters, and apply(k, op) that
// calls op on alternative k. The selectable components (reco/composition.hpp) are built on it, so
// an objective compiled once switches its components at run time: each alternative's own
// functions run unchanged, and nothing is instantiated per combination of slots.
//
// apply is a chain of comparisons on a call-wide index: the branch goes the same way for every
// token of a call and costs next to nothing once predicted. Ops that run on SIMD packs must be
// function objects whose call operator is RECO_TOKEN_MATH (always inlined), never lambdas: the
// packed pass is compiled for another instruction set and must not call out with packs.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "reco/config.hpp"
#include "reco/detail/math.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class... A>
struct one_of;

template <class H>
struct one_of<H> {
  H head{};
  static constexpr int size = 1;
  template <class Op>
  RECO_TOKEN_MATH decltype(auto) apply(int, const Op& op) const {
    return op(head);
  }
  template <class Op>
  void apply_mut(int, Op&& op) {
    op(head);
  }
  template <class Op>
  void visit(int, Op&& op) const {
    op(head);
  }
  template <int I>
  RECO_HOST_DEVICE H& get() {
    static_assert(I == 0, "one_of::get: index out of range");
    return head;
  }
  template <int I>
  RECO_HOST_DEVICE const H& get() const {
    static_assert(I == 0, "one_of::get: index out of range");
    return head;
  }
};

template <class H, class... T>
struct one_of<H, T...> {
  H head{};
  one_of<T...> tail{};
  static constexpr int size = 1 + static_cast<int>(sizeof...(T));
  template <class Op>
  RECO_TOKEN_MATH decltype(auto) apply(int k, const Op& op) const {
    if (k <= 0) return op(head);
    return tail.apply(k - 1, op);
  }
  template <class Op>
  void apply_mut(int k, Op&& op) {
    if (k <= 0) op(head);
    else tail.apply_mut(k - 1, std::forward<Op>(op));
  }
  template <class Op>
  void visit(int k, Op&& op) const {
    if (k <= 0) op(head);
    else tail.visit(k - 1, std::forward<Op>(op));
  }
  template <int I>
  RECO_HOST_DEVICE auto& get() {
    if constexpr (I == 0) return head;
    else return tail.template get<I - 1>();
  }
  template <int I>
  RECO_HOST_DEVICE const auto& get() const {
    if constexpr (I == 0) return head;
    else return tail.template get<I - 1>();
  }
};

// The index of type C among the alternatives A... (-1 when absent).
template <class C, class... A>
constexpr int index_in() {
  int k = 0, found = -1;
  ((std::is_same_v<C, A> ? (found = found < 0 ? k : found, ++k) : ++k), ...);
  return found;
}
template <class C, class Alts>
struct alternative_index;
template <class C, class... A>
struct alternative_index<C, one_of<A...>> : std::integral_constant<int, index_in<C, A...>()> {};

// A component's key fields (`fields(params, v)`; none for a component without parameters).
struct ignore_field {
  template <class T>
  void operator()(const char*, T&) const {}
};
template <class C, class = void>
struct has_field_list : std::false_type {};
template <class C>
struct has_field_list<C, std::void_t<decltype(C::fields(std::declval<typename C::params_type&>(),
                                                        std::declval<ignore_field&>()))>> : std::true_type {};

template <class C, class V>
void visit_component_fields(C& c, V& v) {
  if constexpr (has_field_list<C>::value) C::fields(c.params, v);
}

template <class C, class = void>
struct has_prepare_member : std::false_type {};
template <class C>
struct has_prepare_member<C, std::void_t<decltype(std::declval<C&>().prepare())>> : std::true_type {};

// The host-side duties a selectable component forwards to its chosen alternative: its key
// fields, its parameter checks and its host preparation.
template <class Alts, class V>
void chosen_fields(Alts& alts, int kind, V& v) {
  alts.apply_mut(kind, [&](auto& c) { visit_component_fields(c, v); });
}
template <class Alts>
void validate_chosen(const Alts& alts, int kind, const std::string& name) {
  alts.visit(kind, [&](const auto& c) { validate_component(c, name.c_str()); });
}
template <class Alts>
void prepare_chosen(Alts& alts, int kind) {
  alts.apply_mut(kind, [](auto& c) {
    if constexpr (has_prepare_member<std::decay_t<decltype(c)>>::value) c.prepare();
  });
}

// Checks a kind index read from a key or a name table.
inline void check_kind(int kind, int count, const std::string& name) {
  if (kind < 0 || kind >= count)
    fail(name + ".kind", "index " + std::to_string(kind) + " outside [0, " + std::to_string(count) + ")");
}

// The common part of a selectable component (CRTP): the chosen kind and every alternative in
// params, the chosen one's key fields, checks and host preparation, apply(op) on the chosen one,
// and from(c), the selectable form of one fixed alternative with its parameters. Kind lists the
// alternatives A... in order; Default is the kind a default-constructed component chooses.
template <class Derived, class Kind, Kind Default, class... A>
struct choice_of {
  using alternatives = one_of<A...>;
  struct params_type {
    Kind kind = Default;
    alternatives choices;
  };
  params_type params{};

  template <class C>
  static Derived from(const C& c) {
    constexpr int k = alternative_index<C, alternatives>::value;
    static_assert(k >= 0, "reco: from(c): c is not one of this slot's components");
    Derived d;
    d.params.kind = static_cast<Kind>(k);
    d.params.choices.template get<k>() = c;
    return d;
  }
  template <class V>
  static void fields(params_type& p, V&& v) {
    chosen_fields(p.choices, static_cast<int>(p.kind), v);
  }
  void validate(const std::string& name) const {
    check_kind(static_cast<int>(params.kind), alternatives::size, name);
    validate_chosen(params.choices, static_cast<int>(params.kind), name);
  }
  void prepare() { prepare_chosen(params.choices, static_cast<int>(params.kind)); }

  RECO_HOST_DEVICE int index() const { return static_cast<int>(params.kind); }
  template <class Op>
  RECO_TOKEN_MATH decltype(auto) apply(const Op& op) const {
    return params.choices.apply(index(), op);
  }
  // The alternative of kind K (its parameters, whether chosen or not).
  template <Kind K>
  RECO_HOST_DEVICE const auto& alternative() const {
    return params.choices.template get<static_cast<int>(K)>();
  }
};

// The common part of an optional term switched at run time (CRTP): whether it is on, and the
// fixed Term with its parameters; Term's key fields only while on (a key of a term that is off
// would be ignored); from(Off) is off, from(Term) on with the term's parameters.
template <class Derived, class Term, class Off>
struct switched_term {
  static constexpr bool selectable = true;
  static constexpr bool active = true;  // may be on: on() says
  struct params_type {
    bool on = false;
    Term term;
  };
  params_type params{};

  template <class V>
  static void fields(params_type& p, V&& v) {
    if (p.on) Term::fields(p.term.params, v);
  }
  void validate(const std::string& name) const {
    if (params.on) params.term.validate(name);
  }
  RECO_HOST_DEVICE bool on() const { return params.on; }

  static Derived from(const Derived& d) { return d; }
  static Derived from(const Off&) { return Derived{}; }
  static Derived from(const Term& t) {
    Derived d;
    d.params.on = true;
    d.params.term = t;
    return d;
  }
};

}  // namespace detail
RECO_NAMESPACE_END
