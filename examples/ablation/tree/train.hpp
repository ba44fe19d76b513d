// The strategy-tree RL trainer: G rollouts per prompt, binary reward, PPO epochs of mini-batches,
// Adam with global gradient clipping. Every objective is a reco objective on the CPU backend
// (presets, or GRPO with reco::caller_weight for the dose series); its d loss / d logp is carried
// to the log-linear policy's parameters by the softmax chain rule. Along the way it measures the
// mechanism the ReCo paper names (docs/ablation.md, "The mechanism, measured directly").
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reco/batch_ops/filter_groups.hpp"
#include "reco/reco.hpp"

#include "exact.hpp"
#include "task.hpp"

namespace tree {

using batch_type = reco::batch_view<double>;
using grads_type = reco::gradients<double>;
using ws_type = reco::workspace<reco::cpu>;

// GRPO with a response weight given by the caller: w_i = min(cap, pi_old(y_i)^-alpha / G), the
// dose series of the expected-count weight (alpha = 1/L is ReCo's weight exactly, since
// pbar = pi^(1/L) for responses of L tokens).
struct weighted_grpo : reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight,
                                       reco::seq_mean_token_mean, reco::kl_penalty> {
  weighted_grpo() {
    reco::presets::detail::grpo_clip(*this);
    reco::presets::detail::paper_kl(*this);
    weight.params.cap = 10.0;
  }
};

// One objective call: loss and d loss / d logp of a batch.
using objective_fn = std::function<reco::objective_result(const batch_type&, grads_type, ws_type&)>;

template <class O>
objective_fn wrap(O o, bool without_kl) {
  if constexpr (std::is_same_v<typename O::kl_type, reco::kl_penalty>)
    if (without_kl) o.kl.params.beta = 0.0;
  return [o](const batch_type& b, grads_type g, ws_type& ws) { return o(reco::cpu{}, b, g, ws); };
}

// An arm of the study.
struct arm {
  std::string name, label, preset;
  double lr_scale = 1.0;
  double alpha = -1.0;        // >= 0: weighted_grpo with w = min(10, pi_old^-alpha / G)
  bool dapo_sampling = false; // DAPO's dynamic sampling (reco::filter_groups, refill)
  bool variance_ratio = false, clip_higher = false;  // for the per-bin clip diagnostic
  // Exploratory (added after the pre-registered results): the dose weight on the correct answers
  // only, rescaled within each group so that the correct answers' weights sum to their number,
  // incorrect answers weight 1 (GRPO's). alpha_one_over_L: alpha = 1/L (ReCo's exponent).
  bool correct_only = false, alpha_one_over_L = false;
  bool exploratory = false;
};

inline const std::vector<arm>& arms() {
  static const std::vector<arm> all = {
      {"grpo", "GRPO", "grpo"},
      {"reco", "ReCo", "reco", 1.0, -1, false, true},
      {"response_only", "Response only", "reco_response_only"},
      {"token_only", "Token only", "reco_token_only", 1.0, -1, false, true},
      {"dapo", "DAPO", "dapo", 1.0, -1, true, false, true},
      {"dapo_reco", "DAPO + ReCo", "dapo_reco", 1.0, -1, true, true, true},
      {"rule_80_20", "80/20", "rule_80_20", 1.0, -1, true, false, true},
      {"rule_80_20_reco", "80/20 + ReCo", "rule_80_20_reco", 1.0, -1, true, true, true},
      {"weight_a05", "w ∝ π_old^-0.5", "", 1.0, 0.5},
      {"weight_a1", "w ∝ π_old^-1", "", 1.0, 1.0},
      {"grpo_lr2", "GRPO, lr/2", "grpo", 0.5},
      {"grpo_lr4", "GRPO, lr/4", "grpo", 0.25},
      {"correct_only_a025", "ReCo's weight, correct answers only", "", 1.0, 0.0, false, false, false, true, true, true},
      {"correct_only_a1", "w ∝ π_old^-1, correct answers only", "", 1.0, 1.0, false, false, false, true, false, true},
  };
  return all;
}

inline const arm& find_arm(const std::string& name) {
  for (const auto& a : arms())
    if (a.name == name) return a;
  throw std::invalid_argument("unknown arm '" + name + "'");
}

inline objective_fn make_objective(const arm& a, bool without_kl = false) {
  namespace P = reco::presets;
  if (a.alpha >= 0) return wrap(weighted_grpo{}, without_kl);
  if (a.preset == "grpo") return wrap(P::grpo{}, without_kl);
  if (a.preset == "reco") return wrap(P::reco{}, without_kl);
  if (a.preset == "reco_response_only") return wrap(P::reco_response_only{}, without_kl);
  if (a.preset == "reco_token_only") return wrap(P::reco_token_only{}, without_kl);
  if (a.preset == "dapo") return wrap(P::dapo{}, without_kl);
  if (a.preset == "dapo_reco") return wrap(P::dapo_reco{}, without_kl);
  if (a.preset == "rule_80_20") return wrap(P::rule_80_20{}, without_kl);
  if (a.preset == "rule_80_20_reco") return wrap(P::rule_80_20_reco{}, without_kl);
  throw std::invalid_argument("arm '" + a.name + "': no objective for preset '" + a.preset + "'");
}

struct train_config {
  int steps = 150;
  int prompts = 16;      // per rollout batch
  int group = 8;         // G
  int epochs = 2;        // PPO epochs over the rollout batch
  int minibatches = 4;   // optimiser steps per epoch
  double lr = 0.03;      // Adam
  double grad_clip = 1.0;
  int dapo_rounds = 3;   // DAPO: generation rounds per step at most
  int eval_every = 10;   // exact held-out evaluation along the trajectory
};

// A rollout batch: R responses of L tokens (padded layout, every token valid).
struct rollouts {
  int R = 0, L = 0;
  std::vector<int> problem;           // [R]
  std::vector<response> resp;         // [R]
  std::vector<int> index;             // [R] response index within its problem
  std::vector<double> old_logp, ref_logp, entropy;  // [R * L]
  std::vector<double> reward;         // [R]
  std::vector<reco::index_t> offsets; // groups of G

  void append(const rollouts& o, int first, int count, int G) {
    L = o.L;
    for (int i = first * G; i < (first + count) * G; ++i) {
      problem.push_back(o.problem[i]);
      resp.push_back(o.resp[i]);
      index.push_back(o.index[i]);
      reward.push_back(o.reward[i]);
      for (int t = 0; t < L; ++t) {
        old_logp.push_back(o.old_logp[i * L + t]);
        ref_logp.push_back(o.ref_logp[i * L + t]);
        entropy.push_back(o.entropy[i * L + t]);
      }
    }
    R = static_cast<int>(problem.size());
    offsets.clear();
    for (int g = 0; g * G <= R; ++g) offsets.push_back(g * G);
  }
};

// Per-token log-probabilities and entropies of given responses under th (node caches per problem).
inline void token_values(const instance& in, const std::vector<double>& th, const std::vector<int>& prob,
                         const std::vector<response>& resp, int first, int count, std::vector<double>& logp,
                         std::vector<double>* entropy) {
  const task_config& c = in.cfg;
  const int L = c.length();
  logp.resize(static_cast<std::size_t>(count * L));
  if (entropy) entropy->resize(logp.size());
  node_logp n;
  int cached = -1;
  for (int j = 0; j < count; ++j) {
    const int i = first + j, p = prob[i];
    if (p != cached) {
      problem_logp(in, th, p, n);
      cached = p;
    }
    const response& r = resp[i];
    logp[j * L] = n.strat[r.s];
    if (entropy) (*entropy)[j * L] = entropy_of(n.strat.data(), c.strategies);
    for (int t = 0; t < c.exec; ++t) {
      const double* node = n.exec.data() + (r.s * c.exec + t) * c.options;
      logp[j * L + 1 + t] = node[r.x[t]];
      if (entropy) (*entropy)[j * L + 1 + t] = entropy_of(node, c.options);
    }
    logp[j * L + L - 1] = n.end[2 * r.s + r.end];
    if (entropy) (*entropy)[j * L + L - 1] = entropy_of(n.end.data() + 2 * r.s, 2);
  }
}

// d loss / d th from d loss / d logp of the responses [first, first + count): the softmax chain
// rule at every node a response passes through, d logp(y) / d z_v = [v = y] - pi_v.
inline void chain_rule(const instance& in, const std::vector<double>& th, const std::vector<int>& prob,
                       const std::vector<response>& resp, int first, int count, const std::vector<double>& g_logp,
                       std::vector<double>& grad) {
  const task_config& c = in.cfg;
  const layout& Ly = in.lay;
  const int L = c.length();
  grad.assign(static_cast<std::size_t>(Ly.size()), 0.0);
  node_logp n;
  int cached = -1;
  for (int j = 0; j < count; ++j) {
    const int i = first + j, p = prob[i];
    if (p != cached) {
      problem_logp(in, th, p, n);
      cached = p;
    }
    const response& r = resp[i];
    const problem& pr = in.problems[p];
    const double g0 = g_logp[j * L];
    for (int v = 0; v < c.strategies; ++v) {
      const double d = g0 * ((v == r.s) - std::exp(n.strat[v]));
      grad[Ly.a(v)] += d;
      grad[Ly.u(p, v)] += d;
    }
    for (int t = 0; t < c.exec; ++t) {
      const double gt = g_logp[j * L + 1 + t];
      const double* node = n.exec.data() + (r.s * c.exec + t) * c.options;
      for (int v = 0; v < c.options; ++v) {
        const double d = gt * ((v == r.x[t]) - std::exp(node[v]));
        grad[Ly.w(p, r.s, t, v)] += d;
        if (v == pr.path[r.s * c.exec + t]) grad[Ly.h(r.s)] += d;
      }
    }
    const double ge = g_logp[j * L + L - 1];
    const double d = ge * ((r.end == 0) - std::exp(n.end[2 * r.s]));
    grad[Ly.e(r.s)] += d;
    grad[Ly.q(p, r.s)] += d;
  }
}

// Draws G responses for each listed problem under th; the rollout policy's log-probabilities
// and entropies are those of th (on-policy sampling), the reference those of the base.
template <class Rng>
rollouts sample(const instance& in, const std::vector<double>& th, const std::vector<int>& which, int G, Rng& rng) {
  const task_config& c = in.cfg;
  const int L = c.length();
  rollouts b;
  b.L = L;
  std::uniform_real_distribution<double> U(0.0, 1.0);
  auto draw = [&](const double* lp, int n) {
    double u = U(rng), acc = 0;
    for (int v = 0; v < n; ++v) {
      acc += std::exp(lp[v]);
      if (u < acc) return v;
    }
    return n - 1;
  };
  node_logp n;
  for (int p : which) {
    problem_logp(in, th, p, n);
    for (int j = 0; j < G; ++j) {
      response r;
      r.s = draw(n.strat.data(), c.strategies);
      r.x.resize(static_cast<std::size_t>(c.exec));
      for (int t = 0; t < c.exec; ++t) r.x[t] = draw(n.exec.data() + (r.s * c.exec + t) * c.options, c.options);
      r.end = draw(n.end.data() + 2 * r.s, 2);
      b.problem.push_back(p);
      b.index.push_back(response_index(c, r));
      b.reward.push_back(is_correct(in, p, r) ? 1.0 : 0.0);
      b.resp.push_back(r);
    }
  }
  b.R = static_cast<int>(b.problem.size());
  token_values(in, th, b.problem, b.resp, 0, b.R, b.old_logp, &b.entropy);
  std::vector<double> ref;
  token_values(in, in.base, b.problem, b.resp, 0, b.R, b.ref_logp, nullptr);
  for (int g = 0; g * G <= b.R; ++g) b.offsets.push_back(g * G);
  return b;
}

inline batch_type view(const rollouts& b, int first, int count, const std::vector<double>& logp,
                       const std::vector<reco::index_t>& offsets, const std::vector<double>& weights) {
  batch_type v;
  v.layout = reco::padded(count, b.L);
  v.group_offsets = reco::span<const reco::index_t>(offsets.data(), offsets.size());
  v.logp = reco::span<const double>(logp.data(), logp.size());
  v.old_logp = reco::span<const double>(b.old_logp.data() + first * b.L, static_cast<std::size_t>(count * b.L));
  v.ref_logp = reco::span<const double>(b.ref_logp.data() + first * b.L, static_cast<std::size_t>(count * b.L));
  v.entropy = reco::span<const double>(b.entropy.data() + first * b.L, static_cast<std::size_t>(count * b.L));
  v.rewards = reco::span<const double>(b.reward.data() + first, static_cast<std::size_t>(count));
  if (!weights.empty()) v.response_weights = reco::span<const double>(weights.data() + first, static_cast<std::size_t>(count));
  return v;
}

// Bins of p_old for the update-scale diagnostic.
inline const std::vector<double>& p_bins() {
  static const std::vector<double> b = {0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0000001};
  return b;
}

// What a run measured.
struct run_result {
  std::string arm;
  uint64_t seed = 0;
  set_eval test, pool;
  std::vector<double> test_pass_by_class[3];  // by eval_ks(), per class (NaN when empty)
  struct point {
    int step;
    double pass1, pass64, pass256, pass1024, kl, token_entropy, reward;
  };
  std::vector<point> trajectory;
  double reward_first = 0, reward_last = 0;  // mean training reward of the first / last 10 steps
  // The mechanism (sums over the run; ratios formed when written).
  double slope_num = 0, slope_den = 0;        // within-problem slope of dlog pi on log pi_old (correct answers)
  double pos_mass = 0, pos_mass_rich = 0;     // positive-advantage gradient mass, and on answers above the median
  double neg_mass = 0;                        // negative-advantage gradient mass (incorrect answers, same groups)
  double distinct = 0, distinct_rich = 0;     // distinct correct answers in mixed groups, and above the median
  double correct_samples = 0;                 // correct samples in mixed groups (repeats = samples / distinct)
  double cos_grpo_reco = 0, cos_own_grpo = 0; int cos_n = 0;
  double wexp_reco_num = 0, wexp_reco_den = 0; // slope of log w on log pi_old, ReCo's weight
  double wexp_own_num = 0, wexp_own_den = 0;   // ... this arm's weight (token-ratio arms)
  double bin_grad[8] = {0}, bin_clip[8] = {0}, bin_tokens[8] = {0};
  double clip_frac = 0, cap_hits = 0; int updates = 0;
  double groups_used = 0;
  std::vector<double> fig1;  // the pooled Figure 1 histogram on the held-out problems (fig1_range)
};

// The range and bins of the Figure 1 histograms: log base(y) / L of correct answers.
struct fig1_range {
  static constexpr double lo = -4.0, hi = 0.0;
  static constexpr int bins = 40;
};

// The exact evaluation at the end of a run: held-out and pool sets, Figure 1, Pass@k by class.
inline void evaluate_final(const instance& in, const std::vector<double>& th, run_result& r) {
  r.test = evaluate_set(in, th, in.train(), in.test());
  r.pool = evaluate_set(in, th, 0, in.train());
  r.fig1 = fig1_histogram(in, th, in.train(), in.test(), fig1_range::lo, fig1_range::hi, fig1_range::bins);
  for (int cl = 0; cl < 3; ++cl) {
    std::vector<double> s(eval_ks().size(), 0.0);
    int n = 0;
    for (int p = 0; p < in.test(); ++p) {
      if (static_cast<int>(in.problems[in.train() + p].cls) != cl) continue;
      ++n;
      for (std::size_t j = 0; j < s.size(); ++j) s[j] += pass_at_k_exact(r.test.per_problem_p[p], eval_ks()[j]);
    }
    for (auto& x : s) x = n ? x / n : NAN;
    r.test_pass_by_class[cl] = s;
  }
}

// The base policy as a run (no training).
inline run_result base_result(const instance& in) {
  run_result r;
  r.arm = "base";
  evaluate_final(in, in.base, r);
  return r;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// GRPO advantage signs and values as the diagnostics use them: (r - mean) / (std + 1e-6), unbiased std.
inline std::vector<double> grpo_advantages(const std::vector<double>& reward, int G) {
  std::vector<double> A(reward.size(), 0.0);
  for (std::size_t g0 = 0; g0 < reward.size(); g0 += G) {
    double m = 0, ss = 0;
    for (int j = 0; j < G; ++j) m += reward[g0 + j];
    m /= G;
    for (int j = 0; j < G; ++j) ss += (reward[g0 + j] - m) * (reward[g0 + j] - m);
    const double sd = std::sqrt(ss / (G - 1));
    for (int j = 0; j < G; ++j) A[g0 + j] = (reward[g0 + j] - m) / (sd + 1e-6);
  }
  return A;
}

// Within-problem regression accumulators: x, y pairs of one problem, demeaned.
inline void add_within(const std::vector<double>& x, const std::vector<double>& y, double& num, double& den) {
  if (x.size() < 2) return;
  double mx = 0, my = 0;
  for (std::size_t j = 0; j < x.size(); ++j) mx += x[j], my += y[j];
  mx /= x.size();
  my /= x.size();
  for (std::size_t j = 0; j < x.size(); ++j) num += (x[j] - mx) * (y[j] - my), den += (x[j] - mx) * (x[j] - mx);
}

inline run_result train(const instance& in, const arm& a, const train_config& cfg, uint64_t seed,
                        bool measure = true) {
  const task_config& c = in.cfg;
  const int L = c.length(), G = cfg.group;
  std::mt19937_64 rng(seed * 6364136223846793005ull + 1442695040888963407ull);
  std::vector<double> th = in.base, m1(th.size(), 0.0), m2(th.size(), 0.0);
  const double lr = cfg.lr * a.lr_scale;
  const objective_fn own = make_objective(a);
  const objective_fn grpo = make_objective(find_arm("grpo")), reco_obj = make_objective(find_arm("reco"));
  const objective_fn own_nokl = make_objective(a, true), grpo_nokl = make_objective(find_arm("grpo"), true),
                     resp_nokl = make_objective(find_arm("response_only"), true);
  const bool own_weight_measurable =
      (a.alpha >= 0 && !a.correct_only) || a.preset == "reco_response_only" || a.preset == "grpo";
  ws_type ws;
  run_result res;
  res.arm = a.name;
  res.seed = seed;
  std::vector<int> order(static_cast<std::size_t>(in.train()));
  std::iota(order.begin(), order.end(), 0);
  std::size_t cursor = order.size();
  auto next_prompts = [&](int n) {
    std::vector<int> out;
    while (static_cast<int>(out.size()) < n) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      out.push_back(order[cursor++]);
    }
    return out;
  };
  auto eval_point = [&](int step, double reward) {
    set_eval e = evaluate_set(in, th, in.train(), in.test());
    res.trajectory.push_back({step, e.pass[0], e.pass[6], e.pass[8], e.pass[10], e.kl, e.token_entropy, reward});
  };
  eval_point(0, NAN);
  std::vector<double> rewards_seen;
  std::uint64_t t_adam = 0;
  std::vector<double> logp, grad_logp, grad, g2, g3, w;
  for (int step = 1; step <= cfg.steps; ++step) {
    rollouts b = sample(in, th, next_prompts(cfg.prompts), G, rng);
    rewards_seen.push_back(std::accumulate(b.reward.begin(), b.reward.end(), 0.0) / b.R);
    if (a.dapo_sampling) {
      // Dynamic sampling: keep the groups whose rewards differ, top up with fresh prompts.
      rollouts kept;
      kept.L = L;
      rollouts cur = b;
      for (int round = 0; round < cfg.dapo_rounds && kept.R < cfg.prompts * G; ++round) {
        if (round > 0) cur = sample(in, th, next_prompts(cfg.prompts), G, rng);
        std::vector<reco::index_t> kr(static_cast<std::size_t>(cur.R)), ko(cur.offsets.size());
        const reco::group_filter_counts cnt = reco::filter_groups(
            reco::cpu{}, reco::span<const double>(cur.reward.data(), cur.reward.size()),
            reco::span<const reco::index_t>(cur.offsets.data(), cur.offsets.size()), reco::group_filter_params{},
            reco::span<reco::index_t>(kr.data(), kr.size()), reco::span<reco::index_t>(ko.data(), ko.size()), ws);
        for (reco::index_t g = 0; g < cnt.groups && kept.R < cfg.prompts * G; ++g)
          kept.append(cur, static_cast<int>(kr[ko[g]] / G), 1, G);
      }
      b = kept;
    }
    res.groups_used += b.R / G;
    if (b.R == 0) continue;
    // Response weights of the dose series: min(cap, pi_old^-alpha / G) given to caller_weight
    // (the cap is the objective's).
    w.clear();
    if (a.alpha >= 0) {
      const double alpha = a.alpha_one_over_L ? 1.0 / L : a.alpha;
      for (int i = 0; i < b.R; ++i) {
        double lp = 0;
        for (int t = 0; t < L; ++t) lp += b.old_logp[i * L + t];
        w.push_back(std::exp(-alpha * lp) / G);
      }
      if (a.correct_only)
        for (int g0 = 0; g0 < b.R; g0 += G) {
          double sum = 0;
          int n = 0;
          for (int j = 0; j < G; ++j)
            if (b.reward[g0 + j] > 0.5) sum += w[g0 + j], ++n;
          for (int j = 0; j < G; ++j) w[g0 + j] = b.reward[g0 + j] > 0.5 ? w[g0 + j] * n / sum : 1.0;
        }
    }
    const std::vector<double> A = grpo_advantages(b.reward, G);

    // ---- The mechanism on the step's batch, on-policy, before any update -------------------
    std::vector<double> old_th;
    if (measure) {
      old_th = th;
      const batch_type full = view(b, 0, b.R, b.old_logp, b.offsets, w);
      std::vector<double> go(b.old_logp.size()), gg(go.size()), gr(go.size());
      own(full, grads_type{go, {}}, ws);
      grpo(full, grads_type{gg, {}}, ws);
      reco_obj(full, grads_type{gr, {}}, ws);
      chain_rule(in, th, b.problem, b.resp, 0, b.R, go, grad);
      chain_rule(in, th, b.problem, b.resp, 0, b.R, gg, g2);
      chain_rule(in, th, b.problem, b.resp, 0, b.R, gr, g3);
      const double ng = std::sqrt(dot(g2, g2)), nr = std::sqrt(dot(g3, g3)), no = std::sqrt(dot(grad, grad));
      if (ng > 0 && nr > 0 && no > 0) {
        res.cos_grpo_reco += dot(g2, g3) / (ng * nr);
        res.cos_own_grpo += dot(grad, g2) / (no * ng);
        ++res.cos_n;
      }
      // Response-level coefficient sum_t d loss / d logp_t of this arm's objective.
      std::vector<double> coef(static_cast<std::size_t>(b.R), 0.0);
      for (int i = 0; i < b.R; ++i)
        for (int t = 0; t < L; ++t) coef[i] += go[i * L + t];
      // The implied response weights (objectives without the KL term, so that the coefficients
      // are w_i A_i times the aggregation's constant): ReCo's and this arm's, against GRPO's.
      std::vector<double> cn(go.size()), cg(go.size()), cr(go.size());
      own_nokl(full, grads_type{cn, {}}, ws);
      grpo_nokl(full, grads_type{cg, {}}, ws);
      resp_nokl(full, grads_type{cr, {}}, ws);
      std::vector<double> lx, wr, wo;
      for (int i = 0; i < b.R; ++i) {
        double sn = 0, sg = 0, sr = 0, lp = 0;
        for (int t = 0; t < L; ++t) sn += cn[i * L + t], sg += cg[i * L + t], sr += cr[i * L + t], lp += b.old_logp[i * L + t];
        if (std::abs(sg) < 1e-12) continue;
        const double rr = sr / sg, ro = sn / sg;
        if (rr > 0 && rr < 9.999) {  // below ReCo's cap (10)
          lx.push_back(lp);
          wr.push_back(std::log(rr));
        }
        if (own_weight_measurable && ro > 0 && ro < 9.999) wo.push_back(std::log(ro));
        else wo.push_back(NAN);
      }
      {
        double mx = 0, my = 0;
        for (std::size_t j = 0; j < lx.size(); ++j) mx += lx[j], my += wr[j];
        if (lx.size() > 1) {
          mx /= lx.size(), my /= lx.size();
          for (std::size_t j = 0; j < lx.size(); ++j)
            res.wexp_reco_num += (lx[j] - mx) * (wr[j] - my), res.wexp_reco_den += (lx[j] - mx) * (lx[j] - mx);
        }
      }
      if (own_weight_measurable) {
        std::vector<double> x, y;
        for (int i = 0, k = 0; i < b.R; ++i) {
          double sg = 0, sn = 0, lp = 0;
          for (int t = 0; t < L; ++t) sg += cg[i * L + t], sn += cn[i * L + t], lp += b.old_logp[i * L + t];
          (void)k;
          if (std::abs(sg) < 1e-12) continue;
          const double ro = sn / sg;
          if (ro > 0 && ro < 9.999) x.push_back(lp), y.push_back(std::log(ro));
        }
        add_within(x, y, res.wexp_own_num, res.wexp_own_den);
      }
      // Rich-get-richer shares, group by group: answers above the median pi_old of the
      // problem's correct answers (exact), their share of the positive-advantage mass and of the
      // distinct correct answers sampled; repeats.
      node_logp n;
      for (int g0 = 0; g0 < b.R; g0 += G) {
        const int p = b.problem[g0];
        int nc = 0;
        for (int j = 0; j < G; ++j) nc += b.reward[g0 + j] > 0.5;
        if (nc == 0 || nc == G) continue;
        problem_logp(in, th, p, n);
        std::vector<double> cl = correct_logp(in, n, p);
        std::sort(cl.begin(), cl.end());
        const double med = cl.size() % 2 ? cl[cl.size() / 2] : 0.5 * (cl[cl.size() / 2 - 1] + cl[cl.size() / 2]);
        std::vector<int> seen;
        for (int j = 0; j < G; ++j) {
          const int i = g0 + j;
          if (b.reward[i] < 0.5) {
            if (A[i] < 0) res.neg_mass += std::abs(coef[i]);
            continue;
          }
          double lp = 0;
          for (int t = 0; t < L; ++t) lp += b.old_logp[i * L + t];
          const bool rich = lp > med + 1e-12;
          res.correct_samples += 1;
          if (A[i] > 0) {
            res.pos_mass += std::abs(coef[i]);
            if (rich) res.pos_mass_rich += std::abs(coef[i]);
          }
          if (std::find(seen.begin(), seen.end(), b.index[i]) == seen.end()) {
            seen.push_back(b.index[i]);
            res.distinct += 1;
            if (rich) res.distinct_rich += 1;
          }
        }
      }
    }

    // ---- PPO: epochs of mini-batches (whole groups), Adam, global clipping -----------------
    const int groups = b.R / G, mbs = std::min(cfg.minibatches, groups);
    for (int epoch = 0; epoch < cfg.epochs; ++epoch)
      for (int k = 0; k < mbs; ++k) {
        const int q0 = groups * k / mbs, q1 = groups * (k + 1) / mbs;
        if (q1 == q0) continue;
        const int r0 = q0 * G, rn = (q1 - q0) * G;
        std::vector<double> ent;
        token_values(in, th, b.problem, b.resp, r0, rn, logp, &ent);
        std::vector<reco::index_t> off;
        for (int g = 0; g <= q1 - q0; ++g) off.push_back(g * G);
        batch_type v = view(b, r0, rn, logp, off, w);
        v.entropy = reco::span<const double>(ent.data(), ent.size());
        grad_logp.assign(logp.size(), 0.0);
        const reco::objective_result out = own(v, grads_type{grad_logp, {}}, ws);
        if (!std::isfinite(out.loss)) throw std::runtime_error(a.name + ": non-finite loss");
        res.clip_frac += out.stats.clip_frac;
        res.cap_hits += out.stats.weight_cap_hits;
        ++res.updates;
        if (measure) {
          // Update scale |d loss / d logp| (per-token scale: times the call's tokens) and the
          // clip fraction, binned by p_old.
          const double eh = a.clip_higher ? 0.28 : 0.2, el = 0.2, dual = a.clip_higher ? 10.0 : 3.0;
          for (int i = 0; i < rn; ++i)
            for (int t = 0; t < L; ++t) {
              const int j = i * L + t;
              const double po = std::exp(b.old_logp[(r0 + i) * L + t]), pc = std::exp(logp[j]);
              int bin = 0;
              while (bin + 2 < static_cast<int>(p_bins().size()) && po >= p_bins()[bin + 1]) ++bin;
              double x = pc / po;
              if (a.variance_ratio) x = std::max(pc * (1 - pc), 1e-12) / std::max(po * (1 - po), 1e-12);
              const double adv = A[r0 + i];
              const bool clipped = (adv > 0 && x > 1 + eh) || (adv < 0 && (x < 1 - el || x > dual));
              res.bin_grad[bin] += std::abs(grad_logp[j]) * rn * L;
              res.bin_clip[bin] += clipped;
              res.bin_tokens[bin] += 1;
            }
        }
        chain_rule(in, th, b.problem, b.resp, r0, rn, grad_logp, grad);
        if (!c.shared_skill)
          for (int s = 0; s < c.strategies; ++s) grad[in.lay.h(s)] = 0.0;
        const double norm = std::sqrt(dot(grad, grad));
        const double scale = norm > cfg.grad_clip ? cfg.grad_clip / norm : 1.0;
        ++t_adam;
        const double b1 = 0.9, b2 = 0.999, c1 = 1 - std::pow(b1, t_adam), c2 = 1 - std::pow(b2, t_adam);
        for (std::size_t j = 0; j < th.size(); ++j) {
          const double gj = grad[j] * scale;
          if (gj == 0.0 && m1[j] == 0.0 && m2[j] == 0.0) continue;
          m1[j] = b1 * m1[j] + (1 - b1) * gj;
          m2[j] = b2 * m2[j] + (1 - b2) * gj * gj;
          th[j] -= lr * (m1[j] / c1) / (std::sqrt(m2[j] / c2) + 1e-8);
        }
      }
    // ---- Rich-get-richer: dlog pi(y) against log pi_old(y), over each problem's correct answers
    if (measure) {
      std::vector<int> ps(b.problem.begin(), b.problem.end());
      std::sort(ps.begin(), ps.end());
      ps.erase(std::unique(ps.begin(), ps.end()), ps.end());
      node_logp n0, n1;
      for (int p : ps) {
        problem_logp(in, old_th, p, n0);
        problem_logp(in, th, p, n1);
        const std::vector<double> x = correct_logp(in, n0, p), y1 = correct_logp(in, n1, p);
        std::vector<double> d(x.size());
        for (std::size_t j = 0; j < x.size(); ++j) d[j] = y1[j] - x[j];
        add_within(x, d, res.slope_num, res.slope_den);
      }
    }
    if ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == cfg.steps) eval_point(step, rewards_seen.back());
  }
  const int n10 = std::min<int>(10, static_cast<int>(rewards_seen.size()));
  for (int j = 0; j < n10; ++j) {
    res.reward_first += rewards_seen[j] / n10;
    res.reward_last += rewards_seen[rewards_seen.size() - 1 - j] / n10;
  }
  if (res.updates > 0) res.clip_frac /= res.updates;
  evaluate_final(in, th, res);
  return res;
}

}  // namespace tree
