// Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").
//
//   double p = reco::eval::pass_at_k(/*n=*/1024, /*c=*/3, /*k=*/256);   // 0.5785...
//   auto curve = reco::eval::pass_at_k_curve(ns, cs, {1, 2, 4, 8});      // many problems
//   curve.mean[j]                 // benchmark pass@ks[j]: mean over problems
//   curve.per_problem[j][i]       // problem i's pass@ks[j]
//
// pass@k = 1 - C(n - c, k) / C(n, k), evaluated as 1 - prod_{i = n-c+1..n} (1 - k / i) in double,
// the product form of the paper's reference code, which never forms a large binomial. When
// n - c < k every k-subset holds a correct sample and the value is exactly 1. k outside [1, n] is
// an error rather than a silent 1: it usually means the sample count was misread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

namespace detail {

inline void check_pass_at_k(std::int64_t n, std::int64_t c, std::int64_t k, const char* n_name,
                            const char* c_name, const char* k_name, std::int64_t problem = -1) {
  // Messages are built only on failure: this runs once per (problem, k) in the batch form.
  const auto where = [problem] {
    return problem < 0 ? std::string() : "problem " + std::to_string(problem) + ": ";
  };
  if (n < 1) fail(n_name, where() + "must be >= 1, got " + std::to_string(n));
  if (c < 0 || c > n)
    fail(c_name, where() + "must be in [0, n = " + std::to_string(n) + "], got " + std::to_string(c));
  if (k < 1 || k > n)
    fail(k_name, where() + "k = " + std::to_string(k) + " is outside [1, n = " + std::to_string(n) + "]");
}

// Assumes valid arguments.
inline double pass_at_k_unchecked(std::int64_t n, std::int64_t c, std::int64_t k) {
  if (n - c < k) return 1.0;
  const double kd = static_cast<double>(k);
  double all_wrong = 1.0;  // probability that a random k-subset holds no correct sample
  for (std::int64_t i = n - c + 1; i <= n; ++i) all_wrong *= 1.0 - kd / static_cast<double>(i);
  return 1.0 - all_wrong;
}

}  // namespace detail

// n samples, c of them correct, k drawn: the probability that at least one drawn sample is correct.
inline double pass_at_k(std::int64_t n, std::int64_t c, std::int64_t k) {
  detail::check_pass_at_k(n, c, k, "n", "c", "k");
  return detail::pass_at_k_unchecked(n, c, k);
}

struct pass_at_k_curve_result {
  std::vector<std::int64_t> ks;                 // as given
  std::vector<double> mean;                     // mean[j]: mean over problems of pass@ks[j]
  std::vector<std::vector<double>> per_problem;  // per_problem[j][i]: problem i, k = ks[j]
};

// Many problems at once: problem i has ns[i] samples of which cs[i] are correct (n may differ
// between problems). Every k must be valid for every problem.
inline pass_at_k_curve_result pass_at_k_curve(span<const std::int64_t> ns, span<const std::int64_t> cs,
                                              const std::vector<std::int64_t>& ks) {
  detail::require(!ns.empty(), "ns", "at least one problem is needed");
  detail::require(cs.size() == ns.size(), "cs",
                  "size " + std::to_string(cs.size()) + " does not match ns (" + std::to_string(ns.size()) + ")");
  detail::require(!ks.empty(), "ks", "at least one k is needed");
  for (index_t i = 0; i < ns.size(); ++i)
    for (std::int64_t k : ks)
      detail::check_pass_at_k(ns[i], cs[i], k, "ns", "cs", "ks", i);
  const std::int64_t num_problems = ns.size();
  pass_at_k_curve_result out;
  out.ks.assign(ks.begin(), ks.end());
  out.per_problem.assign(ks.size(), std::vector<double>(static_cast<std::size_t>(num_problems)));
  RECO_EVAL_PARALLEL_FOR_STATIC
  for (std::int64_t i = 0; i < num_problems; ++i)
    for (std::size_t j = 0; j < ks.size(); ++j)
      out.per_problem[j][static_cast<std::size_t>(i)] =
          detail::pass_at_k_unchecked(ns[i], cs[i], ks[j]);
  out.mean.assign(ks.size(), 0.0);
  for (std::size_t j = 0; j < out.mean.size(); ++j) {
    double sum = 0.0;
    for (double v : out.per_problem[j]) sum += v;
    out.mean[j] = sum / static_cast<double>(num_problems);
  }
  return out;
}

// Same n for every problem (the paper's setting: n = 1024 or 128 samples per problem).
inline pass_at_k_curve_result pass_at_k_curve(std::int64_t n, span<const std::int64_t> cs,
                                              const std::vector<std::int64_t>& ks) {
  std::vector<std::int64_t> ns(static_cast<std::size_t>(cs.size()), n);
  return pass_at_k_curve(span<const std::int64_t>(ns), cs, ks);
}

}  // namespace eval
RECO_NAMESPACE_END
