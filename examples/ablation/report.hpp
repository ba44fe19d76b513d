// Aggregation of the worker outputs into CSV files and the Markdown report (the plots are drawn
// from those CSV files by plots.py).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "reco/eval/kde.hpp"
#include "reco/eval/pass_at_k.hpp"

#include "blas.hpp"
#include "io.hpp"
#include "rl.hpp"
#include "settings.hpp"
#include "statistics.hpp"

#ifndef RECO_ABLATION_PLOTS
#define RECO_ABLATION_PLOTS "examples/ablation/plots.py"
#endif

namespace ablation {

// Mean and sample standard deviation (ddof = 1; 0 for a single value).
struct spread {
  double mean = std::numeric_limits<double>::quiet_NaN();
  double std = 0.0;
  int n = 0;
};

inline spread spread_of(const std::vector<double>& v) {
  spread s;
  std::vector<double> x;
  for (double d : v)
    if (!std::isnan(d)) x.push_back(d);
  s.n = static_cast<int>(x.size());
  if (x.empty()) return s;
  s.mean = std::accumulate(x.begin(), x.end(), 0.0) / x.size();
  if (x.size() > 1) {
    double ss = 0;
    for (double d : x) ss += (d - s.mean) * (d - s.mean);
    s.std = std::sqrt(ss / (x.size() - 1));
  }
  return s;
}

// Subsets of the held-out problems reported separately (the paper's per-benchmark columns).
inline const std::vector<std::string>& subsets() {
  static const std::vector<std::string> s = {"all", "common_only", "both", "rare_only"};
  return s;
}

// Everything read back from one run directory.
struct run_data {
  std::string config;  // "base" or an algorithm name
  int base = 1;        // base policy (pretraining seed index)
  int seed = 0;        // RL seed (0 for a base policy's own evaluation)
  std::vector<int64_t> samples, correct;  // per held-out problem
  std::map<std::string, std::vector<double>> pass;  // subset -> pass@k for ks()
  std::map<std::string, double> distinct_correct;   // subset -> mean distinct correct responses per problem
  std::map<std::string, double> rare_share;         // subset -> share of correct samples using - or /
  std::map<std::string, double> solved;             // subset -> share of problems with >= 1 correct sample
  double self_bleu_correct = 0;
  std::array<double, 3> token_variance{};
  std::array<double, 3> token_variance_se{};
  std::vector<double> base_likelihood;
  std::vector<int> base_likelihood_problem;
  csv_table train;  // empty for the base policy
};

inline std::vector<int64_t> pass_ks(int samples) {
  std::vector<int64_t> ks;
  for (int64_t k = 1; k <= samples; k *= 2) ks.push_back(k);
  return ks;
}

inline run_data read_run(const std::filesystem::path& dir, const std::string& config, int base, int seed,
                         int samples) {
  run_data r;
  r.config = config;
  r.base = base;
  r.seed = seed;
  const csv_table ev = read_csv((dir / "eval.csv").string());
  for (std::size_t i = 0; i < ev.rows.size(); ++i) {
    r.samples.push_back(static_cast<int64_t>(ev.number(i, "samples")));
    r.correct.push_back(static_cast<int64_t>(ev.number(i, "correct")));
  }
  const auto ks = pass_ks(samples);
  for (const auto& sub : subsets()) {
    std::vector<int64_t> ns, cs;
    double distinct = 0, rare = 0, correct = 0, solved = 0;
    for (std::size_t i = 0; i < ev.rows.size(); ++i) {
      if (sub != "all" && ev.text(i, "class") != sub) continue;
      ns.push_back(static_cast<int64_t>(ev.number(i, "samples")));
      cs.push_back(static_cast<int64_t>(ev.number(i, "correct")));
      distinct += ev.number(i, "distinct_correct");
      rare += ev.number(i, "rare_correct");
      correct += ev.number(i, "correct");
      solved += ev.number(i, "correct") > 0 ? 1 : 0;
    }
    if (ns.empty()) continue;
    auto curve = reco::eval::pass_at_k_curve(reco::span<const int64_t>(ns), reco::span<const int64_t>(cs),
                                             std::vector<int64_t>(ks));
    r.pass[sub] = curve.mean;
    r.distinct_correct[sub] = distinct / ns.size();
    r.rare_share[sub] = correct > 0 ? rare / correct : std::numeric_limits<double>::quiet_NaN();
    r.solved[sub] = solved / ns.size();
  }
  const csv_table sm = read_csv((dir / "summary.csv").string());
  for (std::size_t i = 0; i < sm.rows.size(); ++i)
    if (sm.text(i, "key") == "self_bleu_correct") r.self_bleu_correct = sm.number(i, "value");
  const csv_table tv = read_csv((dir / "token_variance.csv").string());
  for (std::size_t i = 0; i < 3 && i < tv.rows.size(); ++i) {
    r.token_variance[i] = tv.number(i, "mean");
    r.token_variance_se[i] = tv.number(i, "standard_error");
  }
  const csv_table bl = read_csv((dir / "base_likelihood.csv").string());
  for (std::size_t i = 0; i < bl.rows.size(); ++i) {
    r.base_likelihood.push_back(bl.number(i, "mean_base_logp"));
    r.base_likelihood_problem.push_back(static_cast<int>(bl.number(i, "problem")));
  }
  if (std::filesystem::exists(dir / "train.csv")) r.train = read_csv((dir / "train.csv").string());
  return r;
}

inline std::string label_of(const std::string& config) {
  if (config == "base") return "Base";
  return find_algorithm(config).label;
}

// "12.3 ± 1.4" (percentages of a fraction); a single run prints without the spread.
inline std::string pct(const spread& v, int digits = 1) {
  if (v.n == 0 || std::isnan(v.mean)) return "–";
  std::string t = fixed(100.0 * v.mean, digits);
  if (v.n > 1) t += " ± " + fixed(100.0 * v.std, digits);
  return t;
}
inline std::string signed_pct(double delta, int digits = 1) {
  if (std::isnan(delta)) return "–";
  return (delta >= 0 ? "+" : "") + fixed(100.0 * delta, digits);
}
inline std::string num(const spread& v, int digits) {
  if (v.n == 0 || std::isnan(v.mean)) return "–";
  std::string t = fixed(v.mean, digits);
  if (v.n > 1) t += " ± " + fixed(v.std, digits);
  return t;
}

// Runs by configuration and the statistics over their seeds.
class study_results {
 public:
  study_results(const std::filesystem::path& out, study_settings& s) : ks_(pass_ks(s.eval.samples)) {
    configs_.push_back("base");
    for (int b = 1; b <= s.bases; ++b)
      runs_["base"].push_back(
          read_run(out / "runs" / ("base_b" + std::to_string(b)), "base", b, 0, s.eval.samples));
    for (const auto& c : s.config_names()) {
      if (s.seeds_of(c) < 1) continue;  // --seeds 0: the base policies only
      configs_.push_back(c);
      for (int b = 1; b <= s.bases; ++b)
        for (int seed = 1; seed <= s.seeds_of(c); ++seed)
          runs_[c].push_back(read_run(out / "runs" / (c + "_b" + std::to_string(b) + "_s" + std::to_string(seed)), c,
                                      b, seed, s.eval.samples));
    }
  }

  const std::vector<std::string>& configs() const { return configs_; }
  const std::vector<run_data>& runs(const std::string& c) const { return runs_.at(c); }
  bool has(const std::string& c) const { return runs_.count(c) > 0; }
  const std::vector<int64_t>& ks() const { return ks_; }
  int k_index(int64_t k) const {
    for (std::size_t j = 0; j < ks_.size(); ++j)
      if (ks_[j] == k) return static_cast<int>(j);
    return -1;
  }

  spread over_seeds(const std::string& c, const std::function<double(const run_data&)>& f) const {
    std::vector<double> v;
    for (const auto& r : runs_.at(c)) v.push_back(f(r));
    return spread_of(v);
  }
  spread pass(const std::string& c, const std::string& sub, int64_t k) const {
    const int j = k_index(k);
    if (j < 0 || !has(c)) return {};
    return over_seeds(c, [&](const run_data& r) {
      return r.pass.count(sub) ? r.pass.at(sub)[j] : std::numeric_limits<double>::quiet_NaN();
    });
  }
  // Mean of a training metric over seeds at each step (and its std).
  std::vector<std::pair<spread, int>> train_curve(const std::string& c, const std::string& metric) const {
    std::vector<std::pair<spread, int>> out;
    const auto& rs = runs_.at(c);
    if (rs.empty() || rs[0].train.rows.empty()) return out;
    for (std::size_t i = 0; i < rs[0].train.rows.size(); ++i) {
      std::vector<double> v;
      for (const auto& r : rs)
        if (i < r.train.rows.size()) v.push_back(r.train.number(i, metric));
      out.emplace_back(spread_of(v), static_cast<int>(rs[0].train.number(i, "step")));
    }
    return out;
  }
  // Mean of a training metric over a window of steps [from, to) (fractions of the run), per seed.
  spread train_window(const std::string& c, const std::string& metric, double from, double to) const {
    return over_seeds(c, [&](const run_data& r) {
      const std::size_t n = r.train.rows.size();
      if (n == 0) return std::numeric_limits<double>::quiet_NaN();
      std::size_t a = static_cast<std::size_t>(std::floor(from * n)), b = static_cast<std::size_t>(std::ceil(to * n));
      a = std::min(a, n - 1);
      b = std::max(a + 1, std::min(b, n));
      double sum = 0;
      for (std::size_t i = a; i < b; ++i) sum += r.train.number(i, metric);
      return sum / static_cast<double>(b - a);
    });
  }

 private:
  std::vector<int64_t> ks_;
  std::vector<std::string> configs_;
  std::map<std::string, std::vector<run_data>> runs_;
};

// Markdown table helper.
class md_table {
 public:
  explicit md_table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string str() const {
    std::string s = "|";
    for (const auto& h : header_) s += " " + h + " |";
    s += "\n|";
    for (std::size_t i = 0; i < header_.size(); ++i) s += i == 0 ? "---|" : "---:|";
    s += "\n";
    for (const auto& r : rows_) {
      s += "|";
      for (const auto& c : r) s += " " + c + " |";
      s += "\n";
    }
    return s;
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

inline std::string compare_words(double delta, double noise) {
  if (std::isnan(delta)) return "not comparable";
  if (std::fabs(delta) <= noise) return "within the seed spread of";
  return delta > 0 ? "above" : "below";
}

// Every run's Pass@k per held-out problem, for the statistics (statistics.hpp).
inline std::vector<stat_run> runs_at_k(const study_results& res, int64_t k) {
  std::vector<stat_run> out;
  for (const auto& c : res.configs())
    for (const auto& r : res.runs(c)) {
      stat_run sr;
      sr.config = c;
      sr.base = r.base;
      for (std::size_t p = 0; p < r.samples.size(); ++p)
        sr.pass.push_back(reco::eval::pass_at_k(r.samples[p], r.correct[p], std::min<int64_t>(k, r.samples[p])));
      out.push_back(std::move(sr));
    }
  return out;
}

// The problem indices of a subset ("all" or a class name) and their classes (the strata).
inline std::pair<std::vector<int>, std::vector<int>> subset_indices(const study_data& data, const std::string& sub) {
  std::vector<int> idx, strata;
  for (std::size_t p = 0; p < data.test.size(); ++p)
    if (sub == "all" || class_name(data.test[p].cls) == sub) {
      idx.push_back(static_cast<int>(p));
      strata.push_back(static_cast<int>(data.test[p].cls));
    }
  return {idx, strata};
}

constexpr int bootstrap_replicates = 2000;
constexpr uint64_t bootstrap_seed = 20261124;

inline std::string percent_points(double v, int digits = 1) {
  return std::isnan(v) ? "–" : ((v >= 0 ? "+" : "") + fixed(100.0 * v, digits));
}

inline std::vector<claim_result> write_report(const std::filesystem::path& out, study_settings& s, const study_data& data,
                         double study_seconds) {
  namespace fs = std::filesystem;
  const study_results res(out, s);
  const auto& ks = res.ks();
  const int64_t kmax = ks.back();
  const int64_t k64 = std::min<int64_t>(64, kmax);
  const std::vector<std::string> subs = subsets();
  const bool have_grpo = res.has("grpo"), have_reco = res.has("reco");

  // ---- CSV files -----------------------------------------------------------------------------
  {
    csv_writer w((out / "pass_at_k_runs.csv").string(), {"config", "base", "seed", "subset", "k", "pass_at_k"});
    for (const auto& c : res.configs())
      for (const auto& r : res.runs(c))
        for (const auto& [sub, v] : r.pass)
          for (std::size_t j = 0; j < ks.size(); ++j)
            w.row({c, std::to_string(r.base), std::to_string(r.seed), sub, std::to_string(ks[j]), exact(v[j])});
  }
  {
    csv_writer w((out / "pass_at_k.csv").string(),
                 {"config", "label", "subset", "k", "mean", "std", "seeds", "delta_vs_grpo"});
    for (const auto& c : res.configs())
      for (const auto& sub : subs)
        for (int64_t k : ks) {
          const spread v = res.pass(c, sub, k);
          if (v.n == 0) continue;
          const double d = have_grpo ? v.mean - res.pass("grpo", sub, k).mean : std::numeric_limits<double>::quiet_NaN();
          w.row({c, label_of(c), sub, std::to_string(k), exact(v.mean), exact(v.std), std::to_string(v.n), exact(d)});
        }
  }
  const std::vector<std::string> train_metrics = {
      "reward",          "entropy",          "abs_kl",           "distinct2",        "self_bleu",
      "loss",            "path_uniqueness",  "clip_frac",        "ppo_kl",           "weight_mean",
      "weight_max",      "cap_hits",         "groups_used",      "weight_spread",    "rare_pos_uniform",
      "rare_pos_weighted", "rare_neg_uniform", "rare_neg_weighted", "neg_pos_weighted", "ratio_gap"};
  {
    csv_writer w((out / "training_dynamics_runs.csv").string(), [&] {
      std::vector<std::string> hh = {"config", "base", "seed", "step"};
      hh.insert(hh.end(), train_metrics.begin(), train_metrics.end());
      return hh;
    }());
    for (const auto& c : res.configs())
      for (const auto& r : res.runs(c))
        for (std::size_t i = 0; i < r.train.rows.size(); ++i) {
          std::vector<std::string> row = {c, std::to_string(r.base), std::to_string(r.seed), r.train.text(i, "step")};
          for (const auto& m : train_metrics) row.push_back(r.train.text(i, m));
          w.row(row);
        }
  }
  {
    std::vector<std::string> h = {"config", "step"};
    for (const auto& m : train_metrics) {
      h.push_back(m + "_mean");
      h.push_back(m + "_std");
    }
    csv_writer w((out / "training_dynamics.csv").string(), h);
    for (const auto& c : res.configs()) {
      if (c == "base") continue;
      std::vector<std::vector<std::pair<spread, int>>> curves;
      for (const auto& m : train_metrics) curves.push_back(res.train_curve(c, m));
      for (std::size_t i = 0; i < curves[0].size(); ++i) {
        std::vector<std::string> row = {c, std::to_string(curves[0][i].second)};
        for (const auto& cv : curves) {
          row.push_back(exact(cv[i].first.mean));
          row.push_back(exact(cv[i].first.std));
        }
        w.row(row);
      }
    }
  }
  const char* segment_names[3] = {"early", "middle", "late"};
  {
    csv_writer w((out / "token_variance.csv").string(),
                 {"config", "segment", "mean", "std_over_seeds", "standard_error", "seeds"});
    for (const auto& c : res.configs())
      for (int b = 0; b < 3; ++b) {
        const spread v = res.over_seeds(c, [b](const run_data& r) { return r.token_variance[b]; });
        const spread se = res.over_seeds(c, [b](const run_data& r) { return r.token_variance_se[b]; });
        w.row({c, segment_names[b], exact(v.mean), exact(v.std), exact(se.mean), std::to_string(v.n)});
      }
  }
  {
    csv_writer w((out / "coverage.csv").string(),
                 {"config", "subset", "distinct_correct_mean", "distinct_correct_std", "rare_share_mean",
                  "rare_share_std", "solved_mean", "solved_std", "seeds"});
    for (const auto& c : res.configs())
      for (const auto& sub : subs) {
        const spread d = res.over_seeds(c, [&](const run_data& r) { return r.distinct_correct.count(sub) ? r.distinct_correct.at(sub) : NAN; });
        const spread rs = res.over_seeds(c, [&](const run_data& r) { return r.rare_share.count(sub) ? r.rare_share.at(sub) : NAN; });
        const spread so = res.over_seeds(c, [&](const run_data& r) { return r.solved.count(sub) ? r.solved.at(sub) : NAN; });
        if (d.n == 0) continue;
        w.row({c, sub, exact(d.mean), exact(d.std), exact(rs.mean), exact(rs.std), exact(so.mean), exact(so.std),
               std::to_string(d.n)});
      }
  }
  // Figure 1: KDE of the base likelihood of correct responses, seeds pooled.
  struct kde_info {
    std::string config;
    std::size_t n = 0;
    double bandwidth = 0, median = 0, mean = 0;
  };
  std::vector<kde_info> kdes;
  {
    csv_writer w((out / "base_likelihood_kde.csv").string(), {"config", "x", "density", "bandwidth", "samples"});
    for (const std::string c : {"base", "grpo", "reco"}) {
      if (!res.has(c)) continue;
      std::vector<double> pooled;
      for (const auto& r : res.runs(c)) pooled.insert(pooled.end(), r.base_likelihood.begin(), r.base_likelihood.end());
      if (pooled.size() < 2) continue;
      auto k = reco::eval::gaussian_kde(pooled);
      for (std::size_t i = 0; i < k.grid.size(); ++i)
        w.row({c, exact(k.grid[i]), exact(k.density[i]), exact(k.bandwidth), std::to_string(pooled.size())});
      kde_info info;
      info.config = c;
      info.n = pooled.size();
      info.bandwidth = k.bandwidth;
      std::vector<double> sorted = pooled;
      std::sort(sorted.begin(), sorted.end());
      info.median = sorted[sorted.size() / 2];
      info.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / sorted.size();
      kdes.push_back(info);
    }
  }

  // Verdicts: the statistics fixed in advance (statistics.hpp, docs/ablation.md).
  std::vector<claim_result> verdicts;
  {
    std::map<int64_t, std::vector<stat_run>> cache;
    auto runs_for = [&](int64_t k) -> const std::vector<stat_run>& {
      auto it = cache.find(k);
      if (it == cache.end()) it = cache.emplace(k, runs_at_k(res, k)).first;
      return it->second;
    };
    verdicts = evaluate_claims(
        paper_claims(kmax), [&](int64_t k) { return runs_for(k); },
        [&](const std::string& sub) { return subset_indices(data, sub); }, bootstrap_replicates, bootstrap_seed);
    csv_writer w((out / "verdicts.csv").string(),
                 {"id", "claim", "treatment", "control", "subset", "k", "family", "delta", "ci_low", "ci_high", "se",
                  "p", "p_holm", "base_policies", "runs_treatment", "runs_control", "verdict"});
    for (const auto& v : verdicts)
      w.row({v.c.id, v.c.text, v.c.treatment, v.c.control, v.c.subset, std::to_string(v.c.k),
             v.c.primary ? "primary" : "secondary", exact(v.delta), exact(v.lo), exact(v.hi), exact(v.se), exact(v.p),
             exact(v.p_adjusted), std::to_string(v.bases), std::to_string(v.runs_treatment),
             std::to_string(v.runs_control), v.verdict});
    // Δ against GRPO at every k, with the same bootstrap (the plots' confidence bands).
    if (have_grpo) {
      csv_writer d((out / "delta_vs_grpo.csv").string(), {"config", "subset", "k", "delta", "ci_low", "ci_high"});
      for (const auto& c : res.configs()) {
        if (c == "grpo") continue;
        for (const std::string sub : {"all", "rare_only"})
          for (int64_t k : ks) {
            auto [idx, strata] = subset_indices(data, sub);
            if (idx.empty()) continue;
            claim cl{"", "", c, "grpo", sub, k, claim::kind::greater, false};
            hierarchical_bootstrap boot(runs_for(k), idx, strata, bootstrap_replicates / 2, bootstrap_seed);
            const claim_result r = boot.evaluate(cl);
            if (r.verdict == "not run") continue;
            d.row({c, sub, std::to_string(k), exact(r.delta), exact(r.lo), exact(r.hi)});
          }
      }
    }
  }

  // ---- Plots (from the CSV files above) -------------------------------------------------------
  // The first interpreter that has matplotlib: $RECO_ABLATION_PYTHON, python3 on the PATH, or the
  // system's /usr/bin/python3 (where Debian's python3-matplotlib lives when PATH has another one).
  std::string python;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("RECO_ABLATION_PYTHON")) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const auto& c : candidates)
    if (std::system(("'" + c + "' -c 'import matplotlib' > /dev/null 2>&1").c_str()) == 0) {
      python = c;
      break;
    }
  std::fflush(stdout);  // keep the program's own lines ahead of the plot script's in a log
  if (!python.empty()) {
    const std::string cmd = "'" + python + "' '" + RECO_ABLATION_PLOTS + "' '" + out.string() + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "warning: plotting failed: %s\n", cmd.c_str());
  } else {
    std::fprintf(stderr, "warning: no python3 with matplotlib found; no plots (scripts/reproduce.sh installs it)\n");
  }

  // ---- Markdown report -----------------------------------------------------------------------
  std::ostringstream md;
  std::array<int, 3> cls{};
  for (const auto& p : data.test) ++cls[static_cast<int>(p.cls)];
  md << "# ReCo ablation study: results\n\n";
  md << "Generated by `reco_ablation` (" << s.mode << " settings, device " << s.device << ", RL lr " << s.rl.lr
     << ", " << s.rl.epochs << " PPO epoch(s), " << s.bases
     << " base polic" << (s.bases == 1 ? "y" : "ies") << " × " << s.seeds << " seed(s) for GRPO and ReCo, × "
     << s.secondary_seeds << " for the other configurations, study wall time " << duration_text(study_seconds)
     << (s.device == "cpu" ? ", " + blas_kernels() : std::string())
     << "). Every number below is also in the CSV files of this directory (rounded here for display); "
        "the settings are in `settings.txt`; the task, the method and a discussion are in `docs/ablation.md`.\n\n";
  md << "**Setting.** Countdown-" << s.task.numbers << " (numbers 1–" << s.task.max_input
     << ", operations + − × ÷, the answer is an expression evaluated left to right; exact verifier, binary "
        "reward). Base policy: a "
     << s.model.layers << "-layer decoder-only transformer (d = " << s.model.d_model << ") pretrained for "
     << s.pretrain.steps << " steps on demonstrations that avoid − and ÷ where + and × work (each rare "
        "operation weighs "
     << s.task.rare_weight << "). RL: " << s.rl.steps << " steps, " << s.rl.prompts << " prompts × G = "
     << s.rl.group << " rollouts at temperature 1.0, " << s.rl.minibatches
     << " PPO mini-batches per rollout batch (one AdamW step each, lr " << s.rl.lr
     << "), KL to the base policy where the preset has one. Evaluation: " << data.test.size()
     << " held-out problems (" << cls[0] << " common_only, " << cls[1] << " both, " << cls[2]
     << " rare_only), n = " << s.eval.samples << " samples each at temperature " << s.eval.temperature
     << ", top-p " << s.eval.top_p << "; Pass@k by the unbiased estimator (reco::eval::pass_at_k_curve), "
        "verifier: the task's exact expression checker (countdown.hpp). ± is the standard deviation over the runs "
        "(base policies × seeds); each base policy is evaluated once.\n\n";
  md << "Problem classes: *common_only* problems are solvable with + and × alone, *both* admit solutions "
        "with and without − or ÷, *rare_only* problems need − or ÷ (the strategies the base policy rarely "
        "uses). The pretraining corpus keeps a sampled rare_only problem with probability "
     << s.pretrain.class_accept[2] << " and the RL prompt pool with probability " << s.train_accept[2]
     << " (the other classes always); the RL pool has "
     << s.train_problems << " problems, each seen about "
     << fixed(static_cast<double>(s.rl.steps) * s.rl.prompts / std::max(1, s.train_problems), 1)
     << " times. Test problems (and their permutations) never appear in pretraining or RL.\n\n";

  {
    md << "## Verdicts on the paper's claims\n\n"
          "Fixed before the results were seen (docs/ablation.md, \"Pre-registered design\"). Δ is the "
          "treatment's Pass@k minus the control's in points, paired by base policy (mean over base policies of "
          "the difference of seed means). The 95 % interval and the two-sided p come from a hierarchical "
          "bootstrap (" << bootstrap_replicates << " replicates: base policies, then seeds within each, then "
          "problems within their class, all with replacement). p is Holm-adjusted within its family (the two "
          "primary endpoints; the secondary claims). A directional claim is *shown* when the adjusted p < 0.05 "
          "with Δ of the claimed sign and *contradicted* when it is < 0.05 with the other sign; S3 is a "
          "non-inferiority claim (shown when the whole interval lies above −2 points). MDE is the smallest Δ "
          "this design detects with 80 % power (2.8 × the bootstrap SE).\n\n";
    md_table t({"", "claim", "Δ (pts)", "95 % CI", "p (Holm)", "MDE", "runs", "verdict"});
    for (const auto& v : verdicts) {
      if (v.verdict == "not run") {
        t.row({v.c.id, v.c.text, "–", "–", "–", "–", "–", "not run"});
        continue;
      }
      const std::string p = v.c.direction == claim::kind::not_worse ? std::string("–") : fixed(v.p_adjusted, 3);
      t.row({v.c.id + (v.c.primary ? " (primary)" : ""), v.c.text, percent_points(v.delta),
             "[" + percent_points(v.lo) + ", " + percent_points(v.hi) + "]", p, fixed(100.0 * 2.8 * v.se, 1),
             std::to_string(v.runs_treatment) + " vs " + std::to_string(v.runs_control) + " (" +
                 std::to_string(v.bases) + " base)",
             "**" + v.verdict + "**"});
    }
    md << t.str() << "\n";
  }

  // Headline.
  md << "## Headline: Base, GRPO and ReCo\n\n";
  {
    std::vector<std::string> h = {"Method"};
    for (int64_t k : ks)
      if (k == 1 || k == 4 || k == 16 || k == 64 || k == kmax) h.push_back("Pass@" + std::to_string(k));
    md_table t(h);
    for (const std::string c : {"base", "grpo", "reco"}) {
      if (!res.has(c)) continue;
      std::vector<std::string> row = {label_of(c)};
      for (int64_t k : ks)
        if (k == 1 || k == 4 || k == 16 || k == 64 || k == kmax) row.push_back(pct(res.pass(c, "all", k)));
      t.row(row);
    }
    if (have_grpo && have_reco) {
      std::vector<std::string> row = {"*Δ ReCo − GRPO*"};
      for (int64_t k : ks)
        if (k == 1 || k == 4 || k == 16 || k == 64 || k == kmax)
          row.push_back("*" + signed_pct(res.pass("reco", "all", k).mean - res.pass("grpo", "all", k).mean) + "*");
      t.row(row);
    }
    md << "Pass@k (%) on all held-out problems.\n\n" << t.str() << "\n";
    if (have_grpo && have_reco) {
      md << "What came out:\n\n";
      std::vector<int64_t> shown = {1, k64, kmax};
      shown.erase(std::unique(shown.begin(), shown.end()), shown.end());
      for (int64_t k : shown) {
        const spread g = res.pass("grpo", "all", k), r = res.pass("reco", "all", k), b = res.pass("base", "all", k);
        const double noise = std::max(g.std, r.std);
        md << "- Pass@" << k << ": ReCo " << pct(r) << " is " << compare_words(r.mean - g.mean, noise) << " GRPO "
           << pct(g) << " (Δ " << signed_pct(r.mean - g.mean) << "); the base policy has " << pct(b) << ".\n";
      }
      md << "\n(\"within the seed spread\" means |Δ| is at most the larger of the two standard deviations.)\n\n";
    }
  }

  // Table: Pass@64 of every configuration.
  md << "## Pass@" << k64 << " of every configuration\n\n";
  {
    md_table t({"Method", "preset", "common_only", "both", "rare_only", "all", "Δ all vs GRPO",
                "Pass@1 all", "Pass@" + std::to_string(kmax) + " all"});
    for (const auto& c : res.configs()) {
      std::vector<std::string> row = {label_of(c), c == "base" ? "–" : "`" + find_algorithm(c).preset + "`"};
      for (const auto& sub : {"common_only", "both", "rare_only", "all"}) row.push_back(pct(res.pass(c, sub, k64)));
      row.push_back(have_grpo && c != "grpo" ? signed_pct(res.pass(c, "all", k64).mean - res.pass("grpo", "all", k64).mean) : "–");
      row.push_back(pct(res.pass(c, "all", 1)));
      row.push_back(pct(res.pass(c, "all", kmax)));
      t.row(row);
    }
    md << "Pass@" << k64 << " (%) per problem class (the paper's per-benchmark columns) and overall.\n\n" << t.str() << "\n";
  }

  auto ablation_table = [&](const std::vector<std::string>& rows, const std::string& caption) {
    md_table t({"Method", "common_only", "both", "rare_only", "all", "Δ all vs GRPO"});
    for (const auto& c : rows) {
      if (!res.has(c)) continue;
      std::vector<std::string> row = {label_of(c)};
      for (const auto& sub : {"common_only", "both", "rare_only", "all"}) row.push_back(pct(res.pass(c, sub, k64)));
      row.push_back(have_grpo && c != "grpo" ? signed_pct(res.pass(c, "all", k64).mean - res.pass("grpo", "all", k64).mean) : "–");
      t.row(row);
    }
    md << caption << "\n\n" << t.str() << "\n";
  };
  md << "## Effect of each correction (paper: ablation of the two corrections)\n\n";
  ablation_table({"grpo", "aspo", "response_only", "token_only", "reco"},
                 "Pass@" + std::to_string(k64) + " (%). Response only: expected-count weights with the standard ratio; "
                 "Token only: the variance ratio with uniform weights; ASPO: the flipped ratio.");
  ablation_table({"reco", "reco_no_cap"}, "Sensitivity to the response-weight cap (paper: response_clip), Pass@" +
                                              std::to_string(k64) + " (%).");

  md << "## Combining ReCo with DAPO and the 80/20 rule\n\n";
  {
    md_table t({"Method", "common_only", "both", "rare_only", "all", "Δ over its base method"});
    const std::vector<std::pair<std::string, std::string>> pairs = {{"dapo", "dapo_reco"}, {"rule_80_20", "rule_80_20_reco"}};
    for (const auto& [a, b] : pairs)
      for (const auto& c : {a, b}) {
        if (!res.has(c)) continue;
        std::vector<std::string> row = {label_of(c)};
        for (const auto& sub : {"common_only", "both", "rare_only", "all"}) row.push_back(pct(res.pass(c, sub, k64)));
        row.push_back(c == b && res.has(a) ? signed_pct(res.pass(b, "all", k64).mean - res.pass(a, "all", k64).mean) : "–");
        t.row(row);
      }
    md << "Pass@" << k64 << " (%). DAPO and the 80/20 presets run with DAPO's group filter (dynamic sampling, up to "
       << s.rl.dapo_rounds << " generation rounds per step) and overlong reward shaping from reco::batch_ops.\n\n"
       << t.str() << "\n";
  }

  md << "## Pass@k for every k\n\n";
  for (const std::string sub : {"all", "rare_only"}) {
    std::vector<std::string> h = {"Method"};
    for (int64_t k : ks) h.push_back(std::to_string(k));
    md_table t(h);
    for (const auto& c : res.configs()) {
      std::vector<std::string> row = {label_of(c)};
      for (int64_t k : ks) row.push_back(pct(res.pass(c, sub, k)));
      t.row(row);
    }
    md << "Pass@k (%) on " << (sub == "all" ? "all held-out problems" : "the rare_only problems") << " (columns: k).\n\n"
       << t.str() << "\n";
  }

  if (have_grpo && have_reco) {
    md << "## Entropy and \\|KL\\| during training (paper: entropy_kl)\n\n";
    auto he = res.train_curve("reco", "entropy"), ge = res.train_curve("grpo", "entropy");
    auto hk = res.train_curve("reco", "abs_kl"), gk = res.train_curve("grpo", "abs_kl");
    md_table t({"Step", "ReCo H", "GRPO H", "ReCo \\|KL\\|", "GRPO \\|KL\\|"});
    const std::size_t n = std::min(he.size(), ge.size());
    std::vector<std::size_t> idx;
    for (int q = 0; q <= 5; ++q) idx.push_back(std::min(n - 1, q * (n - 1) / 5));
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    for (std::size_t i : idx)
      t.row({std::to_string(he[i].second), num(he[i].first, 4), num(ge[i].first, 4), scientific(hk[i].first.mean, 2),
             scientific(gk[i].first.mean, 2)});
    md << "Mean token entropy H of the rollouts (rollout policy, temperature 1.0) and mean \\|logp − ref_logp\\| (k1) "
          "over response tokens, mean (± std for H) over seeds; step 1 is measured before the first update.\n\n"
       << t.str() << "\n";
  }

  md << "## Training dynamics: reward and rollout diversity\n\n";
  {
    md_table t({"Method", "reward first→last", "Distinct-2 first→last", "Self-BLEU first→last",
                "path uniqueness first→last", "entropy last", "cap hits / step"});
    for (const auto& c : res.configs()) {
      if (c == "base") continue;
      auto fl = [&](const std::string& m, int d) {
        return num(res.train_window(c, m, 0.0, 0.1), d) + " → " + num(res.train_window(c, m, 0.9, 1.0), d);
      };
      t.row({label_of(c), fl("reward", 3), fl("distinct2", 3), fl("self_bleu", 3), fl("path_uniqueness", 3),
             num(res.train_window(c, "entropy", 0.9, 1.0), 3), num(res.train_window(c, "cap_hits", 0.0, 1.0), 2)});
    }
    md << "Means over the first and last 10% of RL steps (mean ± std over seeds). Diversity is measured within "
          "each prompt's group of "
       << s.rl.group << " rollouts; path uniqueness counts distinct first steps (the opening of the reasoning "
                        "path). Higher Distinct-2 and lower Self-BLEU mean more diverse rollouts.\n\n"
       << t.str() << "\n";
  }

  md << "## The mechanism, logged during training\n\n";
  {
    // Mean over every step of every run, steps where a metric is undefined skipped.
    auto over_steps = [&](const std::string& c, const std::string& m) {
      return res.over_seeds(c, [&](const run_data& r) {
        if (r.train.rows.empty() || !r.train.has(m)) return std::numeric_limits<double>::quiet_NaN();
        double sum = 0;
        int n = 0;
        for (std::size_t i = 0; i < r.train.rows.size(); ++i) {
          const double v = r.train.number(i, m);
          if (std::isnan(v)) continue;
          sum += v;
          ++n;
        }
        return n ? sum / n : std::numeric_limits<double>::quiet_NaN();
      });
    };
    md_table t({"Method", "w spread among correct", "rare share of + mass: uniform → w", "rare share of − mass: uniform → w",
                "− / + mass with w", "\\|v − r\\| per token", "cap hits / step"});
    for (const auto& c : res.configs()) {
      if (c == "base") continue;
      t.row({label_of(c), num(over_steps(c, "weight_spread"), 3),
             num(over_steps(c, "rare_pos_uniform"), 3) + " → " + num(over_steps(c, "rare_pos_weighted"), 3),
             num(over_steps(c, "rare_neg_uniform"), 3) + " → " + num(over_steps(c, "rare_neg_weighted"), 3),
             num(over_steps(c, "neg_pos_weighted"), 3), num(over_steps(c, "ratio_gap"), 5),
             num(over_steps(c, "cap_hits"), 2)});
    }
    md << "Per RL step, on the rollouts trained on, whatever the configuration (so GRPO's row shows what ReCo's "
          "weight would have done to GRPO's rollouts): w = min(10, 1/(G·π̄_old)) is ReCo's expected-count weight "
          "and A the GRPO advantage. *w spread*: median over groups with at least two correct responses of the "
          "largest over the smallest w among them (1 = the weight cannot tell them apart). *Rare share of + "
          "mass*: the part of Σ A over A > 0 (uniform) or Σ w·A (ReCo) that goes to responses using − or ÷; "
          "*of − mass* the same for the push-down on A < 0. *− / + mass*: Σ w·|A| over A < 0 divided by Σ w·A "
          "over A > 0 (exactly 1 with uniform weights). *|v − r|*: mean over the updates' policy tokens of the "
          "distance between the variance ratio p(1−p)/(p_old(1−p_old)) and the standard ratio p/p_old (0 on "
          "policy). Means over steps, then mean ± std over runs.\n\n"
       << t.str() << "\n";
  }

  md << "## Token variance by position (paper: token-variance figure)\n\n";
  {
    md_table t({"Method", "early (0–33%)", "middle (33–66%)", "late (66–100%)"});
    for (const auto& c : res.configs()) {
      std::vector<std::string> row = {label_of(c)};
      for (int b = 0; b < 3; ++b) row.push_back(num(res.over_seeds(c, [b](const run_data& r) { return r.token_variance[b]; }), 4));
      t.row(row);
    }
    if (have_grpo && have_reco) {
      std::vector<std::string> row = {"*ReCo / GRPO*"};
      for (int b = 0; b < 3; ++b) {
        const double g = res.over_seeds("grpo", [b](const run_data& r) { return r.token_variance[b]; }).mean;
        const double r = res.over_seeds("reco", [b](const run_data& r) { return r.token_variance[b]; }).mean;
        row.push_back("*" + fixed(r / g, 2) + "×*");
      }
      t.row(row);
    }
    md << "Mean p(1 − p) of the sampled tokens of " << s.eval.variance_rollouts
       << " rollouts per held-out problem at temperature 1.0, by relative position in the response.\n\n"
       << t.str() << "\n";
  }

  md << "## Coverage of correct solutions on the held-out problems\n\n";
  {
    md_table t({"Method", "distinct correct / problem", "rare_only: distinct correct", "share of correct using − or ÷",
                "problems solved (≥ 1 of n)", "1 − Self-BLEU among correct"});
    for (const auto& c : res.configs()) {
      t.row({label_of(c), num(res.over_seeds(c, [](const run_data& r) { return r.distinct_correct.at("all"); }), 1),
             num(res.over_seeds(c, [](const run_data& r) { return r.distinct_correct.count("rare_only") ? r.distinct_correct.at("rare_only") : NAN; }), 1),
             pct(res.over_seeds(c, [](const run_data& r) { return r.rare_share.at("all"); })),
             pct(res.over_seeds(c, [](const run_data& r) { return r.solved.at("all"); })),
             num(res.over_seeds(c, [](const run_data& r) { return 1.0 - r.self_bleu_correct; }), 3)});
    }
    md << "From the n = " << s.eval.samples << " evaluation samples per problem: distinct correct responses, the "
          "share of correct samples that use a rare operation (the rarely used strategies), and diversity among "
          "correct responses (Self-BLEU-4 over the first "
       << s.eval.diversity_samples << " samples of each problem, paper: diversity table).\n\n"
       << t.str() << "\n";
  }

  md << "## Base-policy likelihood of correct responses (paper Figure 1)\n\n";
  if (!kdes.empty()) {
    md_table t({"Policy", "correct responses scored", "mean", "median", "KDE bandwidth (Scott)"});
    for (const auto& k : kdes)
      t.row({label_of(k.config), std::to_string(k.n), fixed(k.mean, 3), fixed(k.median, 3), fixed(k.bandwidth, 4)});
    md << "Mean log-probability per token under the base policy of correct responses sampled (temperature "
       << s.eval.temperature << ") from each policy on the held-out problems, seeds pooled. Higher = responses the "
          "base already favours.\n\n"
       << t.str() << "\n";
  }
  // Within-problem Figure 1: on each held-out problem, the base likelihood of a policy's correct
  // responses against that of its own base policy's correct responses (same problem, same base).
  {
    csv_writer w((out / "base_likelihood_by_problem.csv").string(),
                 {"config", "base", "problem", "policy_mean_logp", "base_mean_logp", "delta"});
    md_table t({"Policy", "problem × base pairs", "mean Δ (nats/token)", "share with Δ > 0"});
    for (const auto& c : res.configs()) {
      if (c == "base") continue;
      double sum = 0;
      int pairs = 0, positive = 0;
      for (const auto& ref : res.runs("base")) {
        std::map<int, std::pair<double, int>> own, theirs;
        for (std::size_t i = 0; i < ref.base_likelihood.size(); ++i) {
          auto& a = own[ref.base_likelihood_problem[i]];
          a.first += ref.base_likelihood[i];
          ++a.second;
        }
        for (const auto& r : res.runs(c)) {
          if (r.base != ref.base) continue;
          for (std::size_t i = 0; i < r.base_likelihood.size(); ++i) {
            auto& a = theirs[r.base_likelihood_problem[i]];
            a.first += r.base_likelihood[i];
            ++a.second;
          }
        }
        for (const auto& [problem, v] : theirs) {
          const auto it = own.find(problem);
          if (it == own.end()) continue;
          const double mp = v.first / v.second, mb = it->second.first / it->second.second;
          w.row({c, std::to_string(ref.base), std::to_string(problem), exact(mp), exact(mb), exact(mp - mb)});
          sum += mp - mb;
          positive += mp > mb ? 1 : 0;
          ++pairs;
        }
      }
      if (pairs > 0)
        t.row({label_of(c), std::to_string(pairs), fixed(sum / pairs, 4), fixed(100.0 * positive / pairs, 1) + " %"});
    }
    md << "Within each problem: Δ = mean base log-probability per token of the policy's correct responses minus "
          "that of the base policy's own correct responses on the same problem (same base policy, seeds pooled; "
          "problems where both have a correct response in the scored subsample). Δ > 0: the policy's correct "
          "answers are ones its base already favoured (the paper's concentration).\n\n"
       << t.str() << "\n";
  }

  md << "## Figures\n\n";
  const bool plotted = fs::exists(out / "plots" / "pass_at_k.png");
  if (plotted) {
    md << "![Pass@k](plots/pass_at_k.png)\n\n![Δ vs GRPO by k, with 95 % intervals](plots/delta_vs_grpo.png)\n\n"
          "![Every run](plots/pass_at_k_runs.png)\n\n![Pass@64 by class](plots/pass_at_k_by_class.png)\n\n"
          "![Pass@k, every configuration](plots/pass_at_k_all_configs.png)\n\n"
          "![Training dynamics](plots/training_dynamics.png)\n\n![Base likelihood KDE](plots/base_likelihood_kde.png)\n\n"
          "![Token variance](plots/token_variance.png)\n\n";
  } else {
    md << "No plots: python3 with matplotlib was not available (run `python3 " << RECO_ABLATION_PLOTS
       << " <this directory>` where it is).\n\n";
  }
  md << "## Files\n\n"
        "| file | content |\n|---|---|\n"
        "| `pass_at_k.csv` | Pass@k per configuration, subset and k: mean, std, seeds, Δ vs GRPO |\n"
        "| `pass_at_k_runs.csv` | Pass@k of every run |\n"
        "| `training_dynamics.csv` / `_runs.csv` | per-step metrics (mean/std over seeds; every run) |\n"
        "| `token_variance.csv` | p(1 − p) by position segment |\n"
        "| `coverage.csv` | distinct correct responses, rare-operation share, solved share |\n"
        "| `base_likelihood_kde.csv` | the KDE curves of Figure 1 |\n"
        "| `base_likelihood_by_problem.csv` | Figure 1 within each problem: policy vs base, per base policy |\n"
        "| `verdicts.csv` | the claims, their Δ, bootstrap intervals, p-values and verdicts |\n"
        "| `delta_vs_grpo.csv` | Δ against GRPO at every k with bootstrap intervals (all, rare_only) |\n"
        "| `runs/<config>_b<base>_s<seed>/` | raw per-run outputs (per-problem correct counts, per-step CSV) |\n"
        "| `settings.txt` | every setting of this run |\n";
  std::ofstream f(out / "report.md");
  f << md.str();
  return verdicts;
}

}  // namespace ablation
