// Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").
//
//   double p = reco::eval::pass_at_k(/*n=*/1024, /*c=*/3, /*k=*/256);   // 0.5785...
//   auto curve = reco::eval::pass_at_k_curve(ns, cs, {1, 2, 4, 8});      // many problems
//   curve.mean[j]                 // benchmark pass@ks[j]: mean over problems
//   curve.per_problem[j][i]       // problem i's pass@ks[j]
//
// pass@k = 1 - C(n - c, k) / C(n, k), for any n up to INT64_MAX, never forming a binomial. The
// ratio is symmetric in c and k, so it is a product of m = min(c, k) factors (1 - a / x) with
// a = max(c, k) and x = n - m + 1..n. Its logarithm is summed (compensated) and the result is
// -expm1(sum), which keeps small values accurate. Every factor is at most 1 - a / n, so once
// a·m / n exceeds 40, or the running sum falls below -40, the ratio is below e^-40 < 2^-54 and the
// correctly rounded pass@k is exactly 1: the work stops there. Beyond 2^14 factors (reachable only
// when n is far larger than a and m) the sum is evaluated in closed form (Euler-Maclaurin), so a
// call costs at most 2^14 steps whatever n is.
// When n - c < k every k-subset holds a correct sample and the value is exactly 1; c = 0 gives
// exactly 0. k outside [1, n] is an error rather than a silent 1: it usually means the sample
// count was misread.
#pragma once

#include <algorithm>
#include <cmath>
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

// log(1 - a / x) for 0 < a < x: log1p while a / x is small; otherwise from the exact integer
// x - a (a / x can round to 1, and log1p(-1) is -inf).
inline double log_one_minus_ratio(std::int64_t a, std::int64_t x) {
  const double ad = static_cast<double>(a), xd = static_cast<double>(x);
  if (ad <= 0.5 * xd) return std::log1p(-ad / xd);
  return std::log(static_cast<double>(x - a) / xd);
}

// Below this log of the all-wrong ratio, pass@k rounds to exactly 1 (e^-40 < 2^-54).
constexpr double pass_at_k_log_cutoff = -40.0;
// Up to this many factors the log-sum is taken term by term.
constexpr std::int64_t pass_at_k_direct_terms = std::int64_t{1} << 14;

// sum_{x = L..U} g(x), g(x) = log(1 - a / x), L = n - m + 1, U = n, for m > pass_at_k_direct_terms
// and a·m / n <= 41. Then a, m <= n / 400, every x - a is above 0.99 n and g is smooth, so
// Euler-Maclaurin with the g' and g''' corrections leaves a remainder below 1e-3 · 24 a m / L^5,
// under 1e-16. The integral is  [-a log x + x phi(a / x)]_L^U  with
// phi(t) = (1 - t) log(1 - t) + t = sum_{p >= 2} t^p / (p (p - 1)), both parts written so that
// nothing large cancels: -a log(U / L) = -a log1p((U - L) / L), and
// U phi(a / U) - L phi(a / L) = sum_p L r^p / (p (p - 1)) · expm1(-(p - 1) log(U / L)), r = a / L.
inline double log_all_wrong_euler_maclaurin(std::int64_t n, std::int64_t a, std::int64_t m) {
  const double ad = static_cast<double>(a);
  const double U = static_cast<double>(n);
  const double L = static_cast<double>(n - m + 1);
  const double log_u_over_l = std::log1p(static_cast<double>(m - 1) / L);
  const double r = ad / L;  // <= 0.0026
  double series = 0.0, r_pow = r;
  for (int p = 2; p <= 60; ++p) {
    r_pow *= r;
    const double term =
        L * r_pow / (static_cast<double>(p) * (p - 1)) * std::expm1(-(p - 1) * log_u_over_l);
    series += term;
    if (std::fabs(term) <= 1e-18 * std::fabs(series)) break;
  }
  const double integral = -ad * log_u_over_l + series;
  const auto g = [ad](double x) { return std::log1p(-ad / x); };
  const auto g1 = [ad](double x) { return ad / (x * (x - ad)); };
  const auto g3 = [ad](double x) { return 2.0 / ((x - ad) * (x - ad) * (x - ad)) - 2.0 / (x * x * x); };
  return integral + 0.5 * (g(L) + g(U)) + (g1(U) - g1(L)) / 12.0 - (g3(U) - g3(L)) / 720.0;
}

// Assumes valid arguments.
inline double pass_at_k_unchecked(std::int64_t n, std::int64_t c, std::int64_t k) {
  if (n - c < k) return 1.0;
  if (c == 0) return 0.0;
  const std::int64_t m = std::min(c, k), a = std::max(c, k);  // a + m <= n
  // The log-sum is at most -a·m / n; 41 leaves room for the rounding of this estimate.
  if (static_cast<double>(a) / static_cast<double>(n) * static_cast<double>(m) > 41.0) return 1.0;
  double sum;
  if (m <= pass_at_k_direct_terms) {
    sum = 0.0;
    double compensation = 0.0;  // Neumaier summation
    for (std::int64_t j = 0; j < m; ++j) {
      const double term = log_one_minus_ratio(a, n - j);
      const double t = sum + term;
      compensation += std::fabs(sum) >= std::fabs(term) ? (sum - t) + term : (term - t) + sum;
      sum = t;
      if (sum + compensation < pass_at_k_log_cutoff) return 1.0;
    }
    sum += compensation;
  } else {
    sum = log_all_wrong_euler_maclaurin(n, a, m);
  }
  if (sum < pass_at_k_log_cutoff) return 1.0;
  return -std::expm1(sum);
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
  detail::parallel_for(num_problems, detail::loop_schedule::blocks, [&](std::int64_t i) {
    for (std::size_t j = 0; j < ks.size(); ++j)
      out.per_problem[j][static_cast<std::size_t>(i)] = detail::pass_at_k_unchecked(ns[i], cs[i], ks[j]);
  });
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
