// The strategy-tree task (docs/ablation.md, "The strategy tree"): a response is a strategy token,
// E execution tokens and an end token; a problem is solved by the strategies valid for it, each
// executed along its one correct path and closed by EOS. The policy is log-linear: shared
// parameters (a strategy prior, an execution and an end skill per strategy) that carry what is
// learnt from one problem to every other, plus per-problem parameters (the base's knowledge of
// the problem, trained on the RL pool only). Every response of a problem can be enumerated
// (S * V^E * 2 of them), so Pass@k, entropy and KL are computed exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace tree {

struct task_config {
  int strategies = 8;    // S
  int exec = 2;          // E execution tokens
  int options = 4;       // V choices per execution token
  int train_problems = 64;
  int test_problems = 256;
  int common = 2;              // strategies 0 .. common-1 are the common ones
  double valid_common = 0.6;   // P(strategy valid) for a common strategy
  double valid_rare = 0.3;     // ... for a rare one (common .. S-1)
  double skew = 0.9;           // base strategy prior: logit -skew * s
  double knowledge = 1.0;      // base per-problem logit bonus of a valid strategy
  double noise = 0.5;          // std of the base per-problem strategy logits
  double skill_common = 2.0;   // base execution skill (logit of the correct option), strategy 0
  double skill_rare = 0.8;     // ... strategy S-1 (linear in between)
  double exec_noise = 0.3;     // std of the base per-problem execution logits
  double end_skill = 3.0;      // base logit of EOS against "more"
  bool shared_skill = false;   // whether RL trains the shared execution skill h (else held fixed)
  int length() const { return exec + 2; }                     // L tokens per response
  int responses() const { return strategies * pow_int(options, exec) * 2; }
  int vocab() const { return strategies + options + 2; }      // token ids: s | S + v | EOS | MORE
  static int pow_int(int b, int e) {
    int r = 1;
    for (int i = 0; i < e; ++i) r *= b;
    return r;
  }
};

enum class problem_class { common_only, both, rare_only };
inline const char* class_name(problem_class c) {
  return c == problem_class::common_only ? "common_only" : c == problem_class::both ? "both" : "rare_only";
}

struct problem {
  std::vector<char> valid;         // [S]
  std::vector<int> path;           // [S * E] correct option of each execution token
  problem_class cls = problem_class::both;
};

// The policy's parameters. Shared: a (strategy prior), h (execution skill), e (end skill), one
// per strategy. Per problem p: u[p][s] (strategy), w[p][s][t][v] (execution), q[p][s] (end).
// Flat, so that the optimiser, the gradient and the finite-difference test see one vector.
struct layout {
  int S, E, V, N;
  int shared() const { return 3 * S; }
  int per_problem() const { return S + S * E * V + S; }
  int size() const { return shared() + N * per_problem(); }
  int a(int s) const { return s; }
  int h(int s) const { return S + s; }
  int e(int s) const { return 2 * S + s; }
  int u(int p, int s) const { return shared() + p * per_problem() + s; }
  int w(int p, int s, int t, int v) const { return shared() + p * per_problem() + S + (s * E + t) * V + v; }
  int q(int p, int s) const { return shared() + p * per_problem() + S + S * E * V + s; }
};

struct instance {
  task_config cfg;
  std::vector<problem> problems;  // [0, train) the RL pool, [train, train + test) held out
  layout lay;
  std::vector<double> base;       // the base policy's parameters
  int train() const { return cfg.train_problems; }
  int test() const { return cfg.test_problems; }
};

inline instance make_instance(const task_config& c, uint64_t seed) {
  if (c.strategies < 3 || c.exec < 1 || c.options < 2 || c.train_problems < 1 || c.test_problems < 1)
    throw std::invalid_argument("tree task: strategies >= 3, exec >= 1, options >= 2, problems >= 1");
  instance in;
  in.cfg = c;
  const int S = c.strategies, E = c.exec, V = c.options, N = c.train_problems + c.test_problems;
  in.lay = layout{S, E, V, N};
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 11);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::normal_distribution<double> Z(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, V - 1);
  in.problems.resize(static_cast<std::size_t>(N));
  for (auto& p : in.problems) {
    p.valid.assign(static_cast<std::size_t>(S), 0);
    int n = 0;
    while (n == 0) {  // every problem solvable
      n = 0;
      for (int s = 0; s < S; ++s) {
        p.valid[s] = U(rng) < (s < c.common ? c.valid_common : c.valid_rare);
        n += p.valid[s];
      }
    }
    bool common = false, rare = false;
    for (int s = 0; s < S; ++s) (s < c.common ? common : rare) = (s < c.common ? common : rare) || p.valid[s];
    p.cls = common && rare ? problem_class::both : common ? problem_class::common_only : problem_class::rare_only;
    p.path.resize(static_cast<std::size_t>(S * E));
    for (auto& x : p.path) x = pick(rng);
  }
  in.base.assign(static_cast<std::size_t>(in.lay.size()), 0.0);
  for (int s = 0; s < S; ++s) {
    in.base[in.lay.a(s)] = -c.skew * s;
    in.base[in.lay.h(s)] = c.skill_common + (c.skill_rare - c.skill_common) * s / (S - 1);
    in.base[in.lay.e(s)] = c.end_skill;
  }
  for (int p = 0; p < N; ++p)
    for (int s = 0; s < S; ++s) {
      in.base[in.lay.u(p, s)] = c.knowledge * in.problems[p].valid[s] + c.noise * Z(rng);
      for (int t = 0; t < E; ++t)
        for (int v = 0; v < V; ++v) in.base[in.lay.w(p, s, t, v)] = c.exec_noise * Z(rng);
    }
  return in;
}

// log-softmax of n logits.
inline void log_softmax(const double* z, int n, double* out) {
  double m = z[0];
  for (int i = 1; i < n; ++i) m = std::max(m, z[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(z[i] - m);
  const double l = m + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = z[i] - l;
}

// The log-probabilities of every decision of problem p under parameters th: the strategy node
// [S], the execution nodes [S * E * V] (node (s, t) has V options) and the end nodes [S * 2]
// (EOS, MORE). Execution nodes depend on the strategy and the position, not on earlier
// execution tokens, so a response's probability is a product over its nodes.
struct node_logp {
  std::vector<double> strat, exec, end;
};

inline void problem_logp(const instance& in, const std::vector<double>& th, int p, node_logp& out) {
  const auto& L = in.lay;
  const int S = L.S, E = L.E, V = L.V;
  out.strat.resize(S);
  out.exec.resize(static_cast<std::size_t>(S * E * V));
  out.end.resize(static_cast<std::size_t>(S * 2));
  std::vector<double> z(static_cast<std::size_t>(std::max(S, V)));
  for (int s = 0; s < S; ++s) z[s] = th[L.a(s)] + th[L.u(p, s)];
  log_softmax(z.data(), S, out.strat.data());
  const problem& pr = in.problems[p];
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < E; ++t) {
      for (int v = 0; v < V; ++v) z[v] = th[L.w(p, s, t, v)] + (v == pr.path[s * E + t] ? th[L.h(s)] : 0.0);
      log_softmax(z.data(), V, out.exec.data() + (s * E + t) * V);
    }
    const double ze[2] = {th[L.e(s)] + th[L.q(p, s)], 0.0};
    log_softmax(ze, 2, out.end.data() + 2 * s);
  }
}

// One response as decisions: strategy s, execution options x[0..E), end (0 = EOS, 1 = MORE).
struct response {
  int s = 0;
  std::vector<int> x;
  int end = 0;
};

inline int response_index(const task_config& c, const response& r) {
  int k = r.s;
  for (int t = 0; t < c.exec; ++t) k = k * c.options + r.x[t];
  return k * 2 + r.end;
}
inline response response_of(const task_config& c, int k) {
  response r;
  r.end = k % 2;
  k /= 2;
  r.x.resize(static_cast<std::size_t>(c.exec));
  for (int t = c.exec - 1; t >= 0; --t) {
    r.x[t] = k % c.options;
    k /= c.options;
  }
  r.s = k;
  return r;
}

inline bool is_correct(const instance& in, int p, const response& r) {
  const problem& pr = in.problems[p];
  if (!pr.valid[r.s] || r.end != 0) return false;
  for (int t = 0; t < in.cfg.exec; ++t)
    if (r.x[t] != pr.path[r.s * in.cfg.exec + t]) return false;
  return true;
}

// Index of the correct response of strategy s (valid or not).
inline int correct_index(const instance& in, int p, int s) {
  response r;
  r.s = s;
  r.end = 0;
  r.x.assign(in.problems[p].path.begin() + s * in.cfg.exec, in.problems[p].path.begin() + (s + 1) * in.cfg.exec);
  return response_index(in.cfg, r);
}

// log pi(y) of every response of problem p, by enumeration.
inline void all_response_logp(const instance& in, const node_logp& n, std::vector<double>& out) {
  const task_config& c = in.cfg;
  out.resize(static_cast<std::size_t>(c.responses()));
  for (int k = 0; k < c.responses(); ++k) {
    const response r = response_of(c, k);
    double l = n.strat[r.s];
    for (int t = 0; t < c.exec; ++t) l += n.exec[(r.s * c.exec + t) * c.options + r.x[t]];
    out[k] = l + n.end[2 * r.s + r.end];
  }
}

// log pi of the correct response of each valid strategy of problem p (the problem's correct answers).
inline std::vector<double> correct_logp(const instance& in, const node_logp& n, int p) {
  std::vector<double> out;
  const task_config& c = in.cfg;
  for (int s = 0; s < c.strategies; ++s) {
    if (!in.problems[p].valid[s]) continue;
    double l = n.strat[s];
    for (int t = 0; t < c.exec; ++t) l += n.exec[(s * c.exec + t) * c.options + in.problems[p].path[s * c.exec + t]];
    out.push_back(l + n.end[2 * s]);
  }
  return out;
}

}  // namespace tree
