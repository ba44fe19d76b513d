// Exact evaluation of a strategy-tree policy by enumerating every response of every problem:
// Pass@k (the probability that k independent samples contain a correct one), sequence and token
// entropy, KL to the base policy, the base likelihood of the correct answers (the paper's
// Figure 1, pooled and within each problem) and the effective number of correct solutions.
#pragma once

#include <cmath>
#include <vector>

#include "task.hpp"

namespace tree {

inline const std::vector<int>& eval_ks() {
  static const std::vector<int> k = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  return k;
}

// 1 - (1 - p)^k without cancellation for small p.
inline double pass_at_k_exact(double p, int k) {
  if (p >= 1.0) return 1.0;
  if (p <= 0.0) return 0.0;
  return -std::expm1(static_cast<double>(k) * std::log1p(-p));
}

// Entropy of a distribution given by its log-probabilities.
inline double entropy_of(const double* lp, int n) {
  double h = 0;
  for (int i = 0; i < n; ++i)
    if (lp[i] > -700) h -= std::exp(lp[i]) * lp[i];
  return h;
}

struct problem_eval {
  double p_correct = 0;
  double seq_entropy = 0;     // H(pi(.|p)) in nats
  double token_entropy = 0;   // expected mean entropy per position over a sampled response
  double kl = 0;              // KL(pi || base)
  double fig1_shift = NAN;    // E_pi[log base(y) / L | correct] - E_base[log base(y) / L | correct]
  double fig1_policy = NAN;   // E_pi[log base(y) / L | correct]
  double effective_correct = NAN;  // exp(H(pi | correct)): the effective number of correct solutions
  std::vector<double> correct_prob;       // pi(y) of each correct answer (valid strategies in order)
  std::vector<double> correct_base_logp;  // log base(y) / L of each
};

inline problem_eval evaluate_problem(const instance& in, const std::vector<double>& th, int p) {
  node_logp n, nb;
  problem_logp(in, th, p, n);
  problem_logp(in, in.base, p, nb);
  std::vector<double> lp, lb;
  all_response_logp(in, n, lp);
  all_response_logp(in, nb, lb);
  problem_eval e;
  const task_config& c = in.cfg;
  e.seq_entropy = entropy_of(lp.data(), static_cast<int>(lp.size()));
  for (std::size_t k = 0; k < lp.size(); ++k) e.kl += std::exp(lp[k]) * (lp[k] - lb[k]);
  // Token entropy: the strategy node, then the execution and end nodes of the strategy drawn.
  double h = entropy_of(n.strat.data(), c.strategies);
  for (int s = 0; s < c.strategies; ++s) {
    double hs = entropy_of(n.end.data() + 2 * s, 2);
    for (int t = 0; t < c.exec; ++t) hs += entropy_of(n.exec.data() + (s * c.exec + t) * c.options, c.options);
    h += std::exp(n.strat[s]) * hs;
  }
  e.token_entropy = h / c.length();
  const std::vector<double> cl = correct_logp(in, n, p), cb = correct_logp(in, nb, p);
  double pb = 0, mp = 0, mb = 0, hq = 0;
  for (std::size_t j = 0; j < cl.size(); ++j) {
    e.p_correct += std::exp(cl[j]);
    pb += std::exp(cb[j]);
    e.correct_prob.push_back(std::exp(cl[j]));
    e.correct_base_logp.push_back(cb[j] / c.length());
  }
  if (e.p_correct > 0 && pb > 0) {
    for (std::size_t j = 0; j < cl.size(); ++j) {
      const double q = std::exp(cl[j]) / e.p_correct;
      mp += q * cb[j] / c.length();
      mb += std::exp(cb[j]) / pb * cb[j] / c.length();
      if (q > 0) hq -= q * std::log(q);
    }
    e.fig1_policy = mp;
    e.fig1_shift = mp - mb;
    e.effective_correct = std::exp(hq);
  }
  return e;
}

// Means over a set of problems.
struct set_eval {
  std::vector<double> pass;  // by eval_ks()
  double seq_entropy = 0, token_entropy = 0, kl = 0;
  double fig1_shift = 0, effective_correct = 0;
  std::vector<double> per_problem_p;  // p_correct of each problem of the set
};

inline set_eval evaluate_set(const instance& in, const std::vector<double>& th, int first, int count) {
  set_eval s;
  s.pass.assign(eval_ks().size(), 0.0);
  for (int p = first; p < first + count; ++p) {
    const problem_eval e = evaluate_problem(in, th, p);
    for (std::size_t j = 0; j < eval_ks().size(); ++j) s.pass[j] += pass_at_k_exact(e.p_correct, eval_ks()[j]);
    s.seq_entropy += e.seq_entropy;
    s.token_entropy += e.token_entropy;
    s.kl += e.kl;
    s.fig1_shift += e.fig1_shift;
    s.effective_correct += e.effective_correct;
    s.per_problem_p.push_back(e.p_correct);
  }
  const double n = count;
  for (auto& x : s.pass) x /= n;
  s.seq_entropy /= n;
  s.token_entropy /= n;
  s.kl /= n;
  s.fig1_shift /= n;
  s.effective_correct /= n;
  return s;
}

// The pooled Figure 1: the density of log base(y) / L over the correct answers a policy samples,
// i.e. each correct answer of each problem weighted by pi(y) (then normalised over all of them),
// as a histogram over [lo, hi) in `bins` bins.
inline std::vector<double> fig1_histogram(const instance& in, const std::vector<double>& th, int first, int count,
                                          double lo, double hi, int bins) {
  std::vector<double> h(static_cast<std::size_t>(bins), 0.0);
  double total = 0;
  for (int p = first; p < first + count; ++p) {
    const problem_eval e = evaluate_problem(in, th, p);
    for (std::size_t j = 0; j < e.correct_prob.size(); ++j) {
      int b = static_cast<int>(std::floor((e.correct_base_logp[j] - lo) / (hi - lo) * bins));
      b = std::min(bins - 1, std::max(0, b));
      h[b] += e.correct_prob[j];
      total += e.correct_prob[j];
    }
  }
  if (total > 0)
    for (auto& x : h) x /= total * (hi - lo) / bins;  // a density
  return h;
}

}  // namespace tree
