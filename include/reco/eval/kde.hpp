// One-dimensional Gaussian kernel density estimate (the base-likelihood density of paper Figure 1).
//
//   std::vector<double> ll = reco::eval::mean_log_likelihood_per_response(base_logp, offsets);
//   auto kde = reco::eval::gaussian_kde(ll);            // Scott's rule, 200 points, cut = 3
//   kde.grid, kde.density, kde.bandwidth
//   reco::eval::kde_params p;  p.rule = reco::eval::kde_bandwidth_rule::silverman;
//   auto y = reco::eval::gaussian_kde_evaluate(ll, kde.bandwidth, points);
//
// Bandwidth as scipy.stats.gaussian_kde in one dimension: kernel standard deviation
// h = factor * s, s the sample standard deviation (ddof = 1), factor = n^(-1/5) (Scott) or
// (3n/4)^(-1/5) (Silverman), times `adjust` (seaborn's bw_adjust, default 1).
// density(x) = (1/n) sum_i phi((x - x_i) / h) / h with phi the standard normal density.
// Grid as seaborn's kdeplot: `grid_size` evenly spaced points (default 200) from
// min(x) - cut·h to max(x) + cut·h (cut = 3), so the curve fades out beyond the data.
// Any finite values work, from subnormal to near the largest double: the bandwidth and grid are
// computed on the values scaled by a power of two (exact). All-equal values (compared exactly)
// throw; so does a result that does not fit in a double (a grid end or bandwidth beyond the
// largest double, or a density beyond it when the values' spread is subnormal). grid_size is at
// most kde_max_grid_size (2^24).
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

enum class kde_bandwidth_rule { scott, silverman };

struct kde_params {
  kde_bandwidth_rule rule = kde_bandwidth_rule::scott;
  double adjust = 1.0;       // multiplies the rule's bandwidth
  index_t grid_size = 200;   // points in the evaluation grid (>= 2)
  double cut = 3.0;          // grid extends cut bandwidths beyond the smallest and largest sample
};

struct kde_result {
  std::vector<double> grid;     // evaluation points, increasing
  std::vector<double> density;  // estimate at each grid point
  double bandwidth = 0.0;       // kernel standard deviation h
  double factor = 0.0;          // h / sample std (the rule's factor times adjust)
  double sample_std = 0.0;      // ddof = 1
};

namespace detail {

inline void check_samples(span<const double> samples) {
  require(samples.size() >= 2, "samples",
          "needs at least 2 values for a sample standard deviation, got " + std::to_string(samples.size()));
  for (index_t i = 0; i < samples.size(); ++i)
    if (!std::isfinite(samples[i]))
      fail("samples", "value " + std::to_string(i) + " is not finite");
}

// Two-pass sample standard deviation with ddof = 1.
inline double sample_std_ddof1(span<const double> x) {
  double mean = 0.0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  double ss = 0.0;
  for (double v : x) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / static_cast<double>(x.size() - 1));
}

// (p - x) / h given 1 / h. The difference of two doubles can overflow while the ratio is modest
// (values and bandwidth near the largest double), so an overflowing difference is taken in halves.
inline double standardised_distance(double p, double x, double inv_h) {
  const double d = p - x;
  if (std::isfinite(d)) return d * inv_h;
  return (0.5 * p - 0.5 * x) * inv_h * 2.0;
}

// Density at num_points points. A subnormal bandwidth has no finite reciprocal: then divide
// instead (a zero difference must still give z = 0). The caller checks that the densities are
// finite (a tiny bandwidth can put one beyond the largest double).
inline void evaluate_kde(span<const double> samples, double bandwidth, const double* points, double* out,
                         std::int64_t num_points) {
  const double inv_h = 1.0 / bandwidth;
  const double c = std::sqrt(2.0 * 3.14159265358979323846) * static_cast<double>(samples.size());
  if (std::isfinite(inv_h)) {
    const double norm = inv_h / c;
    parallel_for(num_points, loop_schedule::blocks, [&](std::int64_t g) {
      double s = 0.0;
      for (double xi : samples) {
        const double z = standardised_distance(points[g], xi, inv_h);
        s += std::exp(-0.5 * z * z);
      }
      out[g] = s * norm;
    });
  } else {
    parallel_for(num_points, loop_schedule::blocks, [&](std::int64_t g) {
      double s = 0.0;
      for (double xi : samples) {
        const double d = points[g] - xi;
        const double z = std::isfinite(d) ? d / bandwidth : (0.5 * points[g] - 0.5 * xi) / bandwidth * 2.0;
        s += std::exp(-0.5 * z * z);
      }
      out[g] = s / c / bandwidth;
    });
  }
}

// Exponent e such that every |x| · 2^-e is below 1 (0 when all are 0).
inline int scale_exponent(span<const double> x) {
  double largest = 0.0;
  for (double v : x) largest = std::max(largest, std::fabs(v));
  return largest == 0.0 ? 0 : std::ilogb(largest) + 1;
}

}  // namespace detail

// The rule's factor (before `adjust`) for n samples.
inline double kde_bandwidth_factor(index_t n, kde_bandwidth_rule rule) {
  detail::require(n >= 1, "n", "must be >= 1, got " + std::to_string(n));
  const double nd = static_cast<double>(n);
  switch (rule) {
    case kde_bandwidth_rule::scott: return std::pow(nd, -0.2);
    case kde_bandwidth_rule::silverman: return std::pow(nd * 3.0 / 4.0, -0.2);
  }
  detail::fail("rule", "unknown bandwidth rule");
}

// Density at arbitrary points for a given kernel standard deviation.
inline std::vector<double> gaussian_kde_evaluate(span<const double> samples, double bandwidth,
                                                 span<const double> points) {
  detail::require(!samples.empty(), "samples", "at least one sample is needed");
  for (index_t i = 0; i < samples.size(); ++i)
    if (!std::isfinite(samples[i])) detail::fail("samples", "value " + std::to_string(i) + " is not finite");
  detail::require(std::isfinite(bandwidth) && bandwidth > 0, "bandwidth", "must be finite and > 0");
  for (index_t i = 0; i < points.size(); ++i)
    if (!std::isfinite(points[i])) detail::fail("points", "value " + std::to_string(i) + " is not finite");
  std::vector<double> out(static_cast<std::size_t>(points.size()));
  detail::evaluate_kde(samples, bandwidth, points.data(), out.data(), points.size());
  for (std::size_t g = 0; g < out.size(); ++g)
    if (!std::isfinite(out[g]))
      detail::fail("bandwidth", "the density at point " + std::to_string(g) +
                                    " exceeds the largest double (bandwidth too small)");
  return out;
}

// Largest accepted kde_params::grid_size: the grid and the density take 16 bytes a point, and
// each point costs one kernel evaluation per sample.
constexpr index_t kde_max_grid_size = index_t{1} << 24;

inline kde_result gaussian_kde(span<const double> samples, const kde_params& params = {}) {
  detail::require(params.rule == kde_bandwidth_rule::scott || params.rule == kde_bandwidth_rule::silverman,
                  "params.rule", "unknown bandwidth rule");
  detail::require(std::isfinite(params.adjust) && params.adjust > 0, "params.adjust", "must be finite and > 0");
  detail::require(params.grid_size >= 2 && params.grid_size <= kde_max_grid_size, "params.grid_size",
                  "must be in [2, " + std::to_string(kde_max_grid_size) + "], got " + std::to_string(params.grid_size));
  detail::require(std::isfinite(params.cut) && params.cut >= 0, "params.cut", "must be finite and >= 0");
  detail::check_samples(samples);
  const auto [lo_it, hi_it] = std::minmax_element(samples.begin(), samples.end());
  // scipy fails here too (singular covariance): equal samples leave no scale to smooth with. The
  // test is exact: distinct values, subnormal ones included, are not equal.
  detail::require(*lo_it != *hi_it, "samples", "all values are equal: the bandwidth would be 0");

  // Everything is computed on the samples scaled by a power of two into (-1, 1): no overflow near
  // the largest double (squared deviations, the grid's ends), no underflow for tiny values, and
  // otherwise bit for bit the unscaled computation (a power-of-two scale commutes with rounding).
  // Results are scaled back at the end; one that does not fit in a double throws.
  const int e = detail::scale_exponent(samples);
  std::vector<double> y(static_cast<std::size_t>(samples.size()));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::ldexp(samples[static_cast<index_t>(i)], -e);
  const span<const double> ys(y.data(), static_cast<index_t>(y.size()));
  const double std_y = detail::sample_std_ddof1(ys);  // > 0: the values differ, and |y| < 1
  kde_result out;
  out.factor = kde_bandwidth_factor(samples.size(), params.rule) * params.adjust;
  const double h_y = out.factor * std_y;
  out.sample_std = std::ldexp(std_y, e);
  out.bandwidth = std::ldexp(h_y, e);
  detail::require(std::isfinite(out.sample_std) && std::isfinite(out.bandwidth), "samples",
                  "the spread of the values exceeds the largest double");

  const double lo = std::ldexp(*lo_it, -e) - params.cut * h_y, hi = std::ldexp(*hi_it, -e) + params.cut * h_y;
  const std::size_t m = static_cast<std::size_t>(params.grid_size);
  std::vector<double> grid_y(m);
  // As numpy.linspace: start + i * step, with the last point exactly `hi`.
  const double step = (hi - lo) / static_cast<double>(m - 1);
  for (std::size_t i = 0; i < m; ++i) grid_y[i] = lo + static_cast<double>(i) * step;
  grid_y[m - 1] = hi;
  out.grid.resize(m);
  for (std::size_t i = 0; i < m; ++i) out.grid[i] = std::ldexp(grid_y[i], e);
  detail::require(std::isfinite(out.grid.front()) && std::isfinite(out.grid.back()), "samples",
                  "the grid (cut bandwidths beyond the values) exceeds the largest double");
  out.density.resize(m);
  detail::evaluate_kde(ys, h_y, grid_y.data(), out.density.data(), params.grid_size);
  for (double& d : out.density) {
    d = std::ldexp(d, -e);  // density per unit of the samples: scaled by the same 2^-e
    if (!std::isfinite(d))
      detail::fail("samples", "the density exceeds the largest double: the values' spread is too small "
                              "(subnormal) for a density in double");
  }
  return out;
}

// Length-normalised log-likelihood of each response: the mean of its tokens' log-probabilities
// (under the base model, for Figure 1). Layout as in token_variance.hpp; empty responses throw.
inline std::vector<double> mean_log_likelihood_per_response(span<const double> logp, span<const index_t> offsets) {
  detail::require(offsets.size() >= 2, "offsets", "needs R + 1 >= 2 entries");
  detail::require(offsets[0] == 0, "offsets", "must start at 0");
  detail::require(offsets[offsets.size() - 1] == logp.size(), "offsets",
                  "must end at the number of tokens in logp (" + std::to_string(logp.size()) + ")");
  // Strictly increasing: every response has a token (its mean is undefined otherwise).
  for (index_t r = 0; r + 1 < offsets.size(); ++r)
    if (offsets[r + 1] <= offsets[r])
      detail::fail("offsets", "response " + std::to_string(r) + " is empty or reversed");
  std::vector<double> out(static_cast<std::size_t>(offsets.size() - 1));
  for (index_t r = 0; r + 1 < offsets.size(); ++r) {
    const index_t b = offsets[r], e = offsets[r + 1];
    double s = 0.0;
    for (index_t t = b; t < e; ++t) {
      if (!(logp[t] <= 0.0) || std::isinf(logp[t]))
        detail::fail("logp", "token " + std::to_string(t) + ": must be finite and <= 0");
      s += logp[t];
    }
    if (std::isinf(s)) {
      // The sum overflowed (log-probabilities near -1.7e308); the mean cannot: sum the values
      // scaled by a power of two below 1 and scale the mean back.
      const int ex = detail::scale_exponent(span<const double>(logp.data() + b, e - b));
      s = 0.0;
      for (index_t t = b; t < e; ++t) s += std::ldexp(logp[t], -ex);
      out[static_cast<std::size_t>(r)] = std::ldexp(s / static_cast<double>(e - b), ex);
      continue;
    }
    out[static_cast<std::size_t>(r)] = s / static_cast<double>(e - b);
  }
  return out;
}

}  // namespace eval
RECO_NAMESPACE_END
