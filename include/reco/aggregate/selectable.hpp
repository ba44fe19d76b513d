// selectable_aggregate: one of the five aggregations chosen at run time by its `kind` (a key:
// "aggregate.kind"), so that an objective compiled once can be normalised token-mean (DAPO,
// verl's default), seq-mean-token-mean (GRPO), seq-mean-token-sum or seq-mean-token-sum-norm
// (Dr.GRPO) per call. Each kind's coefficient is the fixed aggregator's own, so the results are
// those of that aggregator, and a split step's plan (reco/step_plan.hpp) stays exact: every kind
// normalises by the counts the plan carries (tokens, responses, R and L_max).
#pragma once

#include <cstdint>
#include <string>

#include "reco/aggregate/seq_mean_token_mean.hpp"
#include "reco/aggregate/seq_mean_token_sum.hpp"
#include "reco/aggregate/seq_mean_token_sum_all.hpp"
#include "reco/aggregate/seq_mean_token_sum_norm.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

enum class aggregation_kind : std::uint8_t {
  token_mean,
  seq_mean_token_mean,
  seq_mean_token_sum,
  seq_mean_token_sum_norm,
  seq_mean_token_sum_all
};
constexpr choice_labels<5> labels_of(aggregation_kind) {
  return {{"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
           "seq_mean_token_sum_all"}};
}

struct selectable_aggregate {
  using role = roles::loss_aggregator;
  struct params_type {
    aggregation_kind kind = aggregation_kind::seq_mean_token_mean;
    double constant = 0.0;    // seq_mean_token_sum_norm only: C (0 = R * L_max)
    double max_length = 0.0;  // seq_mean_token_sum_norm only: L_max (0 = from the layout)
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("kind", p.kind);
    v("constant", p.constant);
    v("max_length", p.max_length);
  }

  // Throws reco::error naming the first parameter out of range; constant and max_length set for
  // another kind would be ignored, so they are errors.
  void validate(const std::string& name) const {
    using detail::check_param;
    sum_norm().validate(name);
    const bool norm = params.kind == aggregation_kind::seq_mean_token_sum_norm;
    check_param(norm || params.constant == 0, name, "constant", "is read only by kind seq_mean_token_sum_norm");
    check_param(norm || params.max_length == 0, name, "max_length", "is read only by kind seq_mean_token_sum_norm");
  }

  RECO_HOST_DEVICE double coefficient(const aggregation_counts& n, index_t response_tokens) const {
    switch (params.kind) {
      case aggregation_kind::token_mean: return token_mean{}.coefficient(n, response_tokens);
      case aggregation_kind::seq_mean_token_mean: return seq_mean_token_mean{}.coefficient(n, response_tokens);
      case aggregation_kind::seq_mean_token_sum: return seq_mean_token_sum{}.coefficient(n, response_tokens);
      case aggregation_kind::seq_mean_token_sum_all: return seq_mean_token_sum_all{}.coefficient(n, response_tokens);
      case aggregation_kind::seq_mean_token_sum_norm: break;
    }
    return sum_norm().coefficient(n, response_tokens);
  }

 private:
  RECO_HOST_DEVICE seq_mean_token_sum_norm sum_norm() const {
    seq_mean_token_sum_norm a;
    a.params.constant = params.constant;
    a.params.max_length = params.max_length;
    return a;
  }
};

// The selectable form of each fixed aggregator, with its parameters.
inline selectable_aggregate selectable_from(const token_mean&) {
  selectable_aggregate a;
  a.params.kind = aggregation_kind::token_mean;
  return a;
}
inline selectable_aggregate selectable_from(const seq_mean_token_mean&) {
  selectable_aggregate a;
  a.params.kind = aggregation_kind::seq_mean_token_mean;
  return a;
}
inline selectable_aggregate selectable_from(const seq_mean_token_sum&) {
  selectable_aggregate a;
  a.params.kind = aggregation_kind::seq_mean_token_sum;
  return a;
}
inline selectable_aggregate selectable_from(const seq_mean_token_sum_norm& s) {
  selectable_aggregate a;
  a.params.kind = aggregation_kind::seq_mean_token_sum_norm;
  a.params.constant = s.params.constant;
  a.params.max_length = s.params.max_length;
  return a;
}
inline selectable_aggregate selectable_from(const seq_mean_token_sum_all&) {
  selectable_aggregate a;
  a.params.kind = aggregation_kind::seq_mean_token_sum_all;
  return a;
}
inline selectable_aggregate selectable_from(const selectable_aggregate& s) { return s; }

RECO_NAMESPACE_END
