// The 80/20 rule (arXiv 2506.01939): only the tokens with the highest entropy (top rho fraction
// of the population) take part in the policy-gradient term; KL and entropy terms are unchanged.
// The three points where implementations disagree are parameters:
//  1. population: by default the batch passed in (the official code's micro-batch). For TRL's
//     gathered micro-batch or the paper's whole mini-batch, compute the threshold over that
//     population with reco::entropy_threshold(...) and pass it in `given`.
//  2. rule: top_k keeps exactly max(1, ceil(rho N)) tokens (ties broken by position: the earlier
//     token wins; the official code's rule); quantile keeps H >= the (1 - rho) quantile with
//     linear interpolation, ties kept (TRL).
//  3. denominator: valid divides by all valid tokens (the paper's 1 / sum |o_i|, TRL); kept
//     divides by the kept tokens only (the official code).
// ceil(rho N) is taken with a relative tolerance of 1e-12 so that 0.2 * 15 keeps 3 tokens.
#pragma once

#include <cstdint>

#include <string>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

enum class selection_rule : std::uint8_t { top_k, quantile };
enum class selection_denominator : std::uint8_t { valid, kept };
constexpr choice_labels<2> labels_of(selection_rule) { return {{"top_k", "quantile"}}; }
constexpr choice_labels<2> labels_of(selection_denominator) { return {{"valid", "kept"}}; }

// A threshold over a population: keep H > value, and of the tokens with H == value the first
// `ties` in position order (ties < 0: all of them).
struct entropy_cut {
  double value = 0;
  index_t ties = -1;
};

struct top_entropy_selection {
  using role = roles::token_selector;
  struct params_type {
    double rho = 0.2;  // kept fraction, in (0, 1]
    selection_rule rule = selection_rule::top_k;
    selection_denominator denominator = selection_denominator::valid;
    bool use_given = false;  // use `given` instead of computing the cut over the batch
    entropy_cut given{};
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("rho", p.rho);
    v("rule", p.rule);
    v("denominator", p.denominator);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.rho > 0 && params.rho <= 1, name, "rho", "must be in (0, 1]");
    check_param(!params.use_given || !(params.given.value != params.given.value), name, "given.value", "must not be NaN");
  }
  static constexpr bool active = true;
};

RECO_NAMESPACE_END
