// The strategy-tree study's claims, fixed before the final study was run (docs/ablation.md,
// "The strategy tree: pre-registered design"), and their evaluation from the runs: per-seed
// differences, paired t, Holm within the primary and the secondary family, verdicts.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../statistics.hpp"
#include "paired_t.hpp"
#include "train.hpp"

namespace tree {

// What a claim compares: a value of a run (by seed) for the treatment and the control arm.
struct tree_claim {
  std::string id, text, treatment, control;  // control "" = one-sample (the value against 0)
  std::string metric;                        // see metric_of
  enum class kind { greater, less, not_worse } direction = kind::greater;
  bool primary = false;
  double margin = 0.02;  // not_worse
  bool exploratory = false;  // added after the pre-registered results: a family of its own
};

struct tree_verdict {
  tree_claim c;
  paired_result r;
  double p_holm = NAN, mde = NAN, multiplier = NAN;
  int excluded = 0;  // seeds without a value (matched comparisons the control never reached)
  std::string verdict;
};

inline std::vector<tree_claim> tree_claims() {
  using K = tree_claim::kind;
  return {
      {"P1", "ReCo raises Pass@1024 over GRPO", "reco", "grpo", "pass1024", K::greater, true},
      {"P2", "ReCo raises Pass@256 over GRPO", "reco", "grpo", "pass256", K::greater, true},
      {"S1", "GRPO lowers Pass@1024 below the base policy", "grpo", "base", "pass1024", K::less},
      {"S2", "GRPO raises Pass@1 over the base policy", "grpo", "base", "pass1", K::greater},
      {"S3", "ReCo keeps GRPO's Pass@1 (loses at most 2 points)", "reco", "grpo", "pass1", K::not_worse},
      {"S4", "ReCo beats GRPO at Pass@1024 at ReCo's Pass@1 (GRPO's trajectory)", "reco", "grpo",
       "matched_pass1:pass1024", K::greater},
      {"S5", "ReCo beats GRPO at Pass@1024 at ReCo's KL (GRPO's trajectory)", "reco", "grpo", "matched_kl:pass1024",
       K::greater},
      {"S6", "The response weight alone raises Pass@1024 over GRPO", "response_only", "grpo", "pass1024", K::greater},
      {"S7", "The variance ratio alone raises Pass@1024 over GRPO", "token_only", "grpo", "pass1024", K::greater},
      {"S8", "Both corrections beat the response weight alone (Pass@1024)", "reco", "response_only", "pass1024",
       K::greater},
      {"S9", "Both corrections beat the variance ratio alone (Pass@1024)", "reco", "token_only", "pass1024",
       K::greater},
      {"S10", "ReCo raises DAPO's Pass@1024", "dapo_reco", "dapo", "pass1024", K::greater},
      {"S11", "ReCo raises the 80/20 rule's Pass@1024", "rule_80_20_reco", "rule_80_20", "pass1024", K::greater},
      {"S12", "The full correction w ∝ π_old^-1 raises Pass@1024 over GRPO", "weight_a1", "grpo", "pass1024",
       K::greater},
      {"S13", "ReCo keeps more token entropy than GRPO", "reco", "grpo", "token_entropy", K::greater},
      {"M1", "GRPO's update is rich-get-richer: slope of Δlog π on log π_old > 0", "grpo", "", "slope", K::greater},
      {"M2", "ReCo's rich-get-richer slope is below GRPO's", "reco", "grpo", "slope", K::less},
      {"M3", "ReCo gives answers above the median π_old less of the positive gradient", "reco", "grpo",
       "rich_share", K::less},
      {"M4", "ReCo's correct answers are less base-likely within a problem (Figure 1 shift)", "reco", "grpo",
       "fig1_shift", K::less},
      // Exploratory, written after the pre-registered results were seen (docs/ablation.md).
      {"E1", "ReCo beats GRPO at Pass@1024 at GRPO's Pass@1 (ReCo's trajectory)", "reco", "grpo",
       "rmatched_pass1:pass1024", K::greater, false, 0.02, true},
      {"E2", "ReCo beats GRPO at Pass@1024 at GRPO's KL (ReCo's trajectory)", "reco", "grpo", "rmatched_kl:pass1024",
       K::greater, false, 0.02, true},
      {"E3", "ReCo's weight on correct answers only raises Pass@1024 over GRPO", "correct_only_a025", "grpo",
       "pass1024", K::greater, false, 0.02, true},
      {"E4", "w ∝ π_old^-1 on correct answers only raises Pass@1024 over GRPO", "correct_only_a1", "grpo", "pass1024",
       K::greater, false, 0.02, true},
      {"E5", "ReCo raises Pass@1024 over GRPO at lr/4", "reco", "grpo_lr4", "pass1024", K::greater, false, 0.02,
       true},
  };
}

// Linear interpolation along a trajectory: the value of `y` where `x` first reaches `target`
// (x taken in step order); NaN when it never does.
inline double at_first_crossing(const std::vector<run_result::point>& tr, double target,
                                double run_result::point::*x, double run_result::point::*y) {
  for (std::size_t j = 0; j + 1 < tr.size(); ++j) {
    const double x0 = tr[j].*x, x1 = tr[j + 1].*x;
    if ((x0 - target) * (x1 - target) <= 0 && x0 != x1) {
      const double f = (target - x0) / (x1 - x0);
      return tr[j].*y + f * (tr[j + 1].*y - tr[j].*y);
    }
    if (x0 == target) return tr[j].*y;
  }
  return NAN;
}

// A run's value of a plain metric.
inline double metric_of(const run_result& r, const std::string& m) {
  const auto& k = eval_ks();
  auto pass = [&](int kk) {
    for (std::size_t j = 0; j < k.size(); ++j)
      if (k[j] == kk) return r.test.pass[j];
    return static_cast<double>(NAN);
  };
  if (m == "pass1") return pass(1);
  if (m == "pass64") return pass(64);
  if (m == "pass256") return pass(256);
  if (m == "pass1024") return pass(1024);
  if (m == "token_entropy") return r.test.token_entropy;
  if (m == "kl") return r.test.kl;
  if (m == "fig1_shift") return r.test.fig1_shift;
  if (m == "effective_correct") return r.test.effective_correct;
  if (m == "slope") return r.slope_den > 0 ? r.slope_num / r.slope_den : NAN;
  if (m == "rich_share") return r.pos_mass > 0 ? r.pos_mass_rich / r.pos_mass : NAN;
  throw std::invalid_argument("unknown metric '" + m + "'");
}

// The per-seed differences of a claim. Matched metrics "matched_<x>:<y>": the treatment's final
// y against the control's y interpolated where its trajectory first reaches the treatment's
// final x (x = pass1 or kl, y = pass1024).
inline std::vector<double> claim_differences(const tree_claim& c, const std::map<std::string, std::map<uint64_t,
                                             const run_result*>>& runs, int& excluded) {
  std::vector<double> d;
  excluded = 0;
  auto t = runs.find(c.treatment);
  if (t == runs.end()) return d;
  // "rmatched_": the other way round, the treatment's trajectory at the control's final x.
  const bool reversed = c.metric.rfind("rmatched_", 0) == 0;
  const bool matched = reversed || c.metric.rfind("matched_", 0) == 0;
  for (const auto& [seed, tr] : t->second) {
    if (c.control.empty()) {
      const double v = metric_of(*tr, c.metric);
      if (std::isnan(v)) ++excluded; else d.push_back(v);
      continue;
    }
    auto u = runs.find(c.control);
    if (u == runs.end() || !u->second.count(seed)) continue;
    const run_result& ctl = *u->second.at(seed);
    if (!matched) {
      const double a = metric_of(*tr, c.metric), b = metric_of(ctl, c.metric);
      if (std::isnan(a) || std::isnan(b)) ++excluded; else d.push_back(a - b);
      continue;
    }
    const std::size_t at = reversed ? 9 : 8;
    const std::string x = c.metric.substr(at, c.metric.find(':') - at), y = c.metric.substr(c.metric.find(':') + 1);
    auto xm = x == "pass1" ? &run_result::point::pass1 : &run_result::point::kl;
    auto ym = y == "pass256" ? &run_result::point::pass256 : &run_result::point::pass1024;
    const run_result& moving = reversed ? *tr : ctl;  // the run whose trajectory is interpolated
    const run_result& fixed_end = reversed ? ctl : *tr;
    const double target = fixed_end.trajectory.back().*xm, end_value = fixed_end.trajectory.back().*ym;
    const double along = at_first_crossing(moving.trajectory, target, xm, ym);
    if (std::isnan(along)) ++excluded;
    else d.push_back(reversed ? along - end_value : end_value - along);
  }
  return d;
}

inline std::vector<tree_verdict> evaluate_tree_claims(
    const std::vector<tree_claim>& claims, const std::map<std::string, std::map<uint64_t, const run_result*>>& runs,
    double alpha = 0.05, double power = 0.8) {
  std::vector<tree_verdict> out;
  for (const auto& c : claims) {
    tree_verdict v;
    v.c = c;
    v.r = paired_t(claim_differences(c, runs, v.excluded));
    if (v.r.n < 2) v.verdict = "not run";
    out.push_back(v);
  }
  for (int family : {0, 1, 2}) {  // primary, secondary, exploratory
    std::vector<double> p;
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < out.size(); ++i)
      if ((out[i].c.primary ? 0 : out[i].c.exploratory ? 2 : 1) == family && out[i].verdict != "not run" &&
          out[i].c.direction != tree_claim::kind::not_worse) {
        p.push_back(out[i].r.p);
        at.push_back(i);
      }
    const auto adj = ablation::holm(p);
    for (std::size_t j = 0; j < at.size(); ++j) {
      tree_verdict& v = out[at[j]];
      v.p_holm = adj[j];
      // The level Holm's first step tests at: a difference of this size is detected with the
      // given power whatever the family's other p-values.
      v.multiplier = detectable_multiplier(alpha / static_cast<double>(p.size()), power, v.r.n);
      v.mde = v.multiplier * v.r.se;
    }
  }
  for (auto& v : out) {
    if (v.verdict == "not run") continue;
    if (v.c.direction == tree_claim::kind::not_worse) {
      v.multiplier = detectable_multiplier(alpha, power, v.r.n);
      v.mde = v.multiplier * v.r.se;
      v.verdict = v.r.lo > -v.c.margin ? "shown" : v.r.hi < -v.c.margin ? "contradicted" : "not shown";
      continue;
    }
    const bool sig = v.p_holm < alpha;
    const bool sign = v.c.direction == tree_claim::kind::greater ? v.r.mean > 0 : v.r.mean < 0;
    v.verdict = !sig ? "not shown" : sign ? "shown" : "contradicted";
  }
  return out;
}

}  // namespace tree
