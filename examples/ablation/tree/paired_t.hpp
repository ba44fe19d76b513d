// The strategy-tree study's statistics, fixed in advance (docs/ablation.md): one difference per
// seed (arms share the seed's task instance, base policy and first rollouts), the mean difference
// with a Student-t interval on n - 1 degrees of freedom, its two-sided p, Holm's correction in
// each family, the detectable effect with the multiplier the corrected level needs, and a verdict.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace tree {

// Regularised incomplete beta I_x(a, b) by its continued fraction (modified Lentz), using the
// symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly.
inline double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0.0;
  if (x >= 1) return 1.0;
  if (x > (a + 1) / (a + b + 2)) return 1.0 - incomplete_beta(b, a, 1 - x);
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                                b * std::log1p(-x)) / a;
  const double tiny = 1e-300;
  double f = 1.0, c = 1.0, d = 0.0;
  for (int i = 0; i <= 400; ++i) {
    const int m = i / 2;
    double num;
    if (i == 0) num = 1.0;
    else if (i % 2 == 0) num = m * (b - m) * x / ((a + 2.0 * m - 1) * (a + 2.0 * m));
    else num = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1));
    d = 1.0 + num * d;
    if (std::abs(d) < tiny) d = tiny;
    d = 1.0 / d;
    c = 1.0 + num / c;
    if (std::abs(c) < tiny) c = tiny;
    const double cd = c * d;
    f *= cd;
    if (std::abs(1.0 - cd) < 1e-15) break;
  }
  return front * (f - 1.0);
}

// P(T <= t) for Student's t with df degrees of freedom.
inline double t_cdf(double t, double df) {
  const double x = df / (df + t * t);
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, x);  // P(T > |t|)
  return t >= 0 ? 1.0 - tail : tail;
}

// The q-quantile of Student's t (bisection on the CDF).
inline double t_quantile(double q, double df) {
  if (!(q > 0 && q < 1) || !(df > 0)) throw std::invalid_argument("t_quantile: q in (0, 1), df > 0");
  double lo = -1e3, hi = 1e3;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (t_cdf(mid, df) < q ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

struct paired_result {
  int n = 0;
  double mean = NAN, se = NAN, lo = NAN, hi = NAN, p = NAN;
};

// Mean of the per-seed differences, its standard error, the 95 % t interval and the two-sided p
// of mean = 0.
inline paired_result paired_t(const std::vector<double>& d) {
  paired_result r;
  r.n = static_cast<int>(d.size());
  if (r.n < 2) return r;
  double m = 0, ss = 0;
  for (double x : d) m += x;
  m /= r.n;
  for (double x : d) ss += (x - m) * (x - m);
  r.mean = m;
  r.se = std::sqrt(ss / (r.n - 1) / r.n);
  const double tq = t_quantile(0.975, r.n - 1);
  r.lo = m - tq * r.se;
  r.hi = m + tq * r.se;
  if (r.se > 0) r.p = 2.0 * (1.0 - t_cdf(std::abs(m) / r.se, r.n - 1));
  else r.p = m == 0 ? 1.0 : 0.0;
  return r;
}

// The smallest true difference detected with the given power by a two-sided test at level alpha
// with n - 1 degrees of freedom: (t_{1 - alpha/2} + t_{power}) * SE. Returns the multiplier.
inline double detectable_multiplier(double alpha, double power, int n) {
  return t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1);
}

}  // namespace tree
