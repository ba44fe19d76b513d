// The study's statistics, fixed before any result was seen (docs/ablation.md, "Statistics fixed
// in advance"): the paper's claims as comparisons of Pass@k, a hierarchical bootstrap over base
// policies, RL seeds and held-out problems, Holm's correction over the secondary comparisons, and a
// plain verdict per claim computed from them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "reco/eval/pass_at_k.hpp"

namespace ablation {

// One training or evaluation run as the statistics see it.
struct stat_run {
  std::string config;  // "base" or an algorithm name
  int base = 1;        // base policy (its runs are paired across configurations)
  std::vector<double> pass;  // Pass@k per held-out problem, for one k
};

// A claim of the paper, as a comparison of two configurations on a subset of problems at one k.
struct claim {
  std::string id;           // short name, e.g. "C2"
  std::string text;         // the claim in words
  std::string treatment, control, subset;
  int64_t k = 64;
  enum class kind { greater, less, not_worse } direction = kind::greater;
  bool primary = false;
  double margin = 0.02;     // not_worse: the largest loss still called "not worse" (fraction)
};

struct claim_result {
  claim c;
  double delta = NAN;       // treatment - control (fraction)
  double lo = NAN, hi = NAN;  // 95 % bootstrap interval
  double se = NAN;          // bootstrap standard error
  double p = NAN;           // two-sided bootstrap p-value of delta = 0
  double p_adjusted = NAN;  // Holm within its family (primary / secondary)
  int bases = 0, runs_treatment = 0, runs_control = 0;
  std::string verdict;      // shown / not shown / contradicted / not run
};

// The configurations' mean Pass@k difference, paired by base policy: mean over the base policies
// of (mean over the treatment's seeds - mean over the control's seeds), each run's Pass@k the
// mean over the subset's problems.
class hierarchical_bootstrap {
 public:
  // `runs` for one k; `subset` the problem indices; `strata` their class (problems are resampled
  // within their class, as the test set was drawn with class quotas).
  hierarchical_bootstrap(std::vector<stat_run> runs, std::vector<int> subset, std::vector<int> strata,
                         int replicates, uint64_t seed)
      : runs_(std::move(runs)), subset_(std::move(subset)), strata_(std::move(strata)), replicates_(replicates),
        seed_(seed) {}

  claim_result evaluate(const claim& c) const {
    claim_result r;
    r.c = c;
    // Runs of each side by base policy; only base policies with runs on both sides pair.
    std::map<int, std::vector<int>> t, u;
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      if (runs_[i].config == c.treatment) t[runs_[i].base].push_back(static_cast<int>(i));
      if (runs_[i].config == c.control) u[runs_[i].base].push_back(static_cast<int>(i));
    }
    std::vector<int> bases;
    for (const auto& [b, v] : t)
      if (u.count(b)) bases.push_back(b);
    if (bases.empty()) {
      r.verdict = "not run";
      return r;
    }
    r.bases = static_cast<int>(bases.size());
    for (int b : bases) {
      r.runs_treatment += static_cast<int>(t[b].size());
      r.runs_control += static_cast<int>(u[b].size());
    }
    std::vector<double> ones(subset_.size(), 1.0);
    r.delta = paired_delta(bases, t, u, ones, nullptr);

    std::mt19937_64 rng(seed_);
    std::vector<double> draws;
    draws.reserve(static_cast<std::size_t>(replicates_));
    std::vector<double> weight(subset_.size());
    for (int rep = 0; rep < replicates_; ++rep) {
      resample_problems(rng, weight);
      std::vector<int> bs(bases.size());
      std::uniform_int_distribution<std::size_t> pick_base(0, bases.size() - 1);
      for (auto& b : bs) b = bases[pick_base(rng)];
      draws.push_back(paired_delta(bs, t, u, weight, &rng));
    }
    std::sort(draws.begin(), draws.end());
    auto quantile = [&](double q) {
      const double pos = q * static_cast<double>(draws.size() - 1);
      const std::size_t i = static_cast<std::size_t>(pos);
      const double f = pos - static_cast<double>(i);
      return i + 1 < draws.size() ? draws[i] * (1 - f) + draws[i + 1] * f : draws[i];
    };
    r.lo = quantile(0.025);
    r.hi = quantile(0.975);
    double mean = 0, ss = 0;
    for (double d : draws) mean += d;
    mean /= static_cast<double>(draws.size());
    for (double d : draws) ss += (d - mean) * (d - mean);
    r.se = std::sqrt(ss / static_cast<double>(draws.size() - 1));
    const double below = static_cast<double>(std::count_if(draws.begin(), draws.end(), [](double d) { return d <= 0; }));
    const double above = static_cast<double>(std::count_if(draws.begin(), draws.end(), [](double d) { return d >= 0; }));
    const double n = static_cast<double>(draws.size());
    // Two-sided; never reported below 1 / replicates (the resolution of the bootstrap).
    r.p = std::min(1.0, std::max(2.0 * std::min(below, above) / n, 1.0 / n));
    return r;
  }

 private:
  // Problems resampled with replacement within their class: weight = times drawn.
  template <class Rng>
  void resample_problems(Rng& rng, std::vector<double>& weight) const {
    std::fill(weight.begin(), weight.end(), 0.0);
    std::map<int, std::vector<std::size_t>> by_class;
    for (std::size_t i = 0; i < subset_.size(); ++i) by_class[strata_[i]].push_back(i);
    for (const auto& [cls, idx] : by_class) {
      std::uniform_int_distribution<std::size_t> pick(0, idx.size() - 1);
      for (std::size_t j = 0; j < idx.size(); ++j) weight[idx[pick(rng)]] += 1.0;
    }
  }

  double run_mean(int run, const std::vector<double>& weight) const {
    double s = 0, w = 0;
    for (std::size_t i = 0; i < subset_.size(); ++i) {
      s += weight[i] * runs_[static_cast<std::size_t>(run)].pass[static_cast<std::size_t>(subset_[i])];
      w += weight[i];
    }
    return s / w;
  }

  // Mean over `bases` (repeats allowed) of the difference of the seed means; with an rng the
  // seeds of each side are resampled with replacement within each drawn base.
  double paired_delta(const std::vector<int>& bases, const std::map<int, std::vector<int>>& t,
                      const std::map<int, std::vector<int>>& u, const std::vector<double>& weight,
                      std::mt19937_64* rng) const {
    auto side = [&](const std::vector<int>& runs) {
      double s = 0;
      if (!rng) {
        for (int i : runs) s += run_mean(i, weight);
      } else {
        std::uniform_int_distribution<std::size_t> pick(0, runs.size() - 1);
        for (std::size_t j = 0; j < runs.size(); ++j) s += run_mean(runs[pick(*rng)], weight);
      }
      return s / static_cast<double>(runs.size());
    };
    double d = 0;
    for (int b : bases) d += side(t.at(b)) - side(u.at(b));
    return d / static_cast<double>(bases.size());
  }

  std::vector<stat_run> runs_;
  std::vector<int> subset_, strata_;
  int replicates_;
  uint64_t seed_;
};

// Holm's step-down adjustment of a family of p-values (same order as given).
inline std::vector<double> holm(const std::vector<double>& p) {
  std::vector<std::size_t> order(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<double> adj(p.size());
  double running = 0;
  const double m = static_cast<double>(p.size());
  for (std::size_t j = 0; j < order.size(); ++j) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(j)) * p[order[j]]));
    adj[order[j]] = running;
  }
  return adj;
}

// The verdict rule (alpha = 0.05 after Holm within the family):
//   greater / less: "shown" when the adjusted p < alpha and delta has the claimed sign,
//   "contradicted" when the adjusted p < alpha and delta has the other sign, else "not shown";
//   not_worse: "shown" when the whole 95 % interval lies above -margin, "contradicted" when it
//   lies below -margin, else "not shown".
inline std::string verdict_of(const claim_result& r, double alpha = 0.05) {
  if (r.verdict == "not run") return r.verdict;
  if (r.c.direction == claim::kind::not_worse) {
    if (r.lo > -r.c.margin) return "shown";
    if (r.hi < -r.c.margin) return "contradicted";
    return "not shown";
  }
  const bool significant = r.p_adjusted < alpha;
  const bool claimed_sign = r.c.direction == claim::kind::greater ? r.delta > 0 : r.delta < 0;
  if (!significant) return "not shown";
  return claimed_sign ? "shown" : "contradicted";
}

// Evaluates the claims (each at its own k and subset), adjusts p within the primary and the
// secondary family and sets the verdicts. `runs_at(k)` gives every run's per-problem Pass@k;
// `subset_of(name)` the problem indices and their classes.
template <class RunsAt, class SubsetOf>
std::vector<claim_result> evaluate_claims(const std::vector<claim>& claims, RunsAt&& runs_at, SubsetOf&& subset_of,
                                          int replicates, uint64_t seed) {
  std::vector<claim_result> out;
  for (const auto& c : claims) {
    auto [idx, strata] = subset_of(c.subset);
    hierarchical_bootstrap boot(runs_at(c.k), idx, strata, replicates, seed);
    out.push_back(boot.evaluate(c));
  }
  for (bool primary : {true, false}) {
    std::vector<double> p;
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i].c.primary == primary && out[i].verdict != "not run" && out[i].c.direction != claim::kind::not_worse) {
        p.push_back(out[i].p);
        at.push_back(i);
      }
    const auto adj = holm(p);
    for (std::size_t j = 0; j < at.size(); ++j) out[at[j]].p_adjusted = adj[j];
  }
  for (auto& r : out) r.verdict = verdict_of(r);
  return out;
}

// The claims of the paper this study tests, fixed in advance. Primary: ReCo against GRPO at
// Pass@64 and Pass@256 (the largest k when fewer samples are drawn) over all held-out problems.
inline std::vector<claim> paper_claims(int64_t kmax) {
  using K = claim::kind;
  const int64_t k64 = std::min<int64_t>(64, kmax), kbig = std::min<int64_t>(256, kmax);
  std::vector<claim> c = {
      {"P1", "ReCo raises Pass@64 over GRPO", "reco", "grpo", "all", k64, K::greater, true},
      {"P2", "ReCo raises Pass@" + std::to_string(kbig) + " over GRPO", "reco", "grpo", "all", kbig, K::greater, true},
      {"S1", "GRPO lowers Pass@" + std::to_string(kbig) + " below the base policy", "grpo", "base", "all", kbig, K::less},
      {"S2", "GRPO raises Pass@1 over the base policy", "grpo", "base", "all", 1, K::greater},
      {"S3", "ReCo keeps GRPO's Pass@1 (loses at most 2 points)", "reco", "grpo", "all", 1, K::not_worse},
      {"S4", "ReCo raises Pass@64 over GRPO on rare_only problems", "reco", "grpo", "rare_only", k64, K::greater},
      {"S5", "The response weight alone raises Pass@64 over GRPO", "response_only", "grpo", "all", k64, K::greater},
      {"S6", "The variance ratio alone raises Pass@64 over GRPO", "token_only", "grpo", "all", k64, K::greater},
      {"S7", "Both corrections beat the response weight alone at Pass@64", "reco", "response_only", "all", k64,
       K::greater},
      {"S8", "Both corrections beat the variance ratio alone at Pass@64", "reco", "token_only", "all", k64, K::greater},
      {"S9", "ReCo raises DAPO's Pass@64", "dapo_reco", "dapo", "all", k64, K::greater},
      {"S10", "ReCo raises the 80/20 rule's Pass@64", "rule_80_20_reco", "rule_80_20", "all", k64, K::greater},
  };
  return c;
}

}  // namespace ablation
