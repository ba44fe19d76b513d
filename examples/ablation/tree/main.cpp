// reco strategy-tree study (docs/ablation.md, "The strategy tree"): twelve arms of GRPO-family
// objectives, each computed by reco on the CPU, trained on an exactly evaluable task; per seed a
// fresh task instance and base policy shared by every arm. Writes the report, CSV files and plots
// and prints the verdict table and the mechanism measurements.
//
//   reco_tree_study [--out DIR] [--seeds N] [--arms a,b,...] [--workers N] [--smoke | --full]
//                   [--set task.key=value | train.key=value ...]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "claims.hpp"
#include "exact.hpp"
#include "task.hpp"
#include "train.hpp"

namespace tree {
namespace fs = std::filesystem;

struct study {
  task_config task;
  train_config train;
  int seeds = 40;
  int workers = 2;
  std::vector<std::string> arms;
  std::string mode = "default";
};

// The pre-registered settings (chosen on GRPO and the base policy only; docs/ablation.md).
inline study preregistered() {
  study s;
  s.task.common = 1;
  s.task.valid_common = 0.6;
  s.task.valid_rare = 0.15;
  s.task.knowledge = 0.5;
  s.task.skew = 1.2;
  s.task.shared_skill = true;
  s.train.lr = 0.06;
  s.train.steps = 200;
  for (const auto& a : arms()) s.arms.push_back(a.name);
  return s;
}

inline void assign(study& s, const std::string& key, const std::string& v) {
  auto d = [&] { return std::stod(v); };
  auto i = [&] { return std::stoi(v); };
  if (key == "task.strategies") s.task.strategies = i();
  else if (key == "task.exec") s.task.exec = i();
  else if (key == "task.options") s.task.options = i();
  else if (key == "task.train_problems") s.task.train_problems = i();
  else if (key == "task.test_problems") s.task.test_problems = i();
  else if (key == "task.common") s.task.common = i();
  else if (key == "task.valid_common") s.task.valid_common = d();
  else if (key == "task.valid_rare") s.task.valid_rare = d();
  else if (key == "task.skew") s.task.skew = d();
  else if (key == "task.knowledge") s.task.knowledge = d();
  else if (key == "task.noise") s.task.noise = d();
  else if (key == "task.skill_common") s.task.skill_common = d();
  else if (key == "task.skill_rare") s.task.skill_rare = d();
  else if (key == "task.exec_noise") s.task.exec_noise = d();
  else if (key == "task.end_skill") s.task.end_skill = d();
  else if (key == "task.shared_skill") s.task.shared_skill = i() != 0;
  else if (key == "train.steps") s.train.steps = i();
  else if (key == "train.prompts") s.train.prompts = i();
  else if (key == "train.group") s.train.group = i();
  else if (key == "train.epochs") s.train.epochs = i();
  else if (key == "train.minibatches") s.train.minibatches = i();
  else if (key == "train.lr") s.train.lr = d();
  else if (key == "train.grad_clip") s.train.grad_clip = d();
  else if (key == "train.dapo_rounds") s.train.dapo_rounds = i();
  else if (key == "train.eval_every") s.train.eval_every = i();
  else throw std::invalid_argument("unknown setting '" + key + "'");
}

inline std::string settings_text(const study& s) {
  std::ostringstream o;
  const task_config& t = s.task;
  const train_config& r = s.train;
  o << "mode=" << s.mode << "\nseeds=" << s.seeds << "\n";
  o << "task.strategies=" << t.strategies << "\ntask.exec=" << t.exec << "\ntask.options=" << t.options
    << "\ntask.train_problems=" << t.train_problems << "\ntask.test_problems=" << t.test_problems
    << "\ntask.common=" << t.common << "\ntask.valid_common=" << t.valid_common << "\ntask.valid_rare=" << t.valid_rare
    << "\ntask.skew=" << t.skew << "\ntask.knowledge=" << t.knowledge << "\ntask.noise=" << t.noise
    << "\ntask.skill_common=" << t.skill_common << "\ntask.skill_rare=" << t.skill_rare
    << "\ntask.exec_noise=" << t.exec_noise << "\ntask.end_skill=" << t.end_skill
    << "\ntask.shared_skill=" << t.shared_skill << "\n";
  o << "train.steps=" << r.steps << "\ntrain.prompts=" << r.prompts << "\ntrain.group=" << r.group
    << "\ntrain.epochs=" << r.epochs << "\ntrain.minibatches=" << r.minibatches << "\ntrain.lr=" << r.lr
    << "\ntrain.grad_clip=" << r.grad_clip << "\ntrain.dapo_rounds=" << r.dapo_rounds
    << "\ntrain.eval_every=" << r.eval_every << "\n";
  return o.str();
}

inline std::string num(double x, int digits = 4) {
  if (std::isnan(x)) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}
inline std::string signed_num(double x, int digits) {
  if (std::isnan(x)) return "–";
  char b[64];
  std::snprintf(b, sizeof b, "%+.*f", digits, x);
  return b;
}

// A claim's values are shown in points when they are Pass@k, as they are otherwise.
inline double shown_scale(const tree_claim& c) {
  return c.metric.find("pass") != std::string::npos ? 100.0 : 1.0;
}

inline const arm* arm_or_null(const std::string& n) {
  for (const auto& a : arms())
    if (a.name == n) return &a;
  return nullptr;
}
inline std::string label_of(const std::string& n) {
  if (n == "base") return "Base";
  const arm* a = arm_or_null(n);
  return a ? a->label : n;
}

// Mean and standard deviation over seeds of a value of the runs of one arm.
template <class F>
std::pair<double, double> mean_sd(const std::vector<const run_result*>& rs, F&& f) {
  double m = 0, ss = 0;
  int n = 0;
  for (auto* r : rs) {
    const double v = f(*r);
    if (std::isnan(v)) continue;
    m += v;
    ++n;
  }
  if (n == 0) return {NAN, NAN};
  m /= n;
  for (auto* r : rs) {
    const double v = f(*r);
    if (!std::isnan(v)) ss += (v - m) * (v - m);
  }
  return {m, n > 1 ? std::sqrt(ss / (n - 1)) : 0.0};
}

int run(study s, const fs::path& out) {
  const auto t0 = std::chrono::steady_clock::now();
  fs::create_directories(out);
  {
    std::ofstream f(out / "settings.txt");
    f << settings_text(s);
  }
  for (const auto& n : s.arms) find_arm(n);
  std::printf("reco strategy-tree study (%s): %zu arms x %d seeds, %d worker(s); S=%d strategies, E=%d, V=%d, L=%d, "
              "RL pool %d, held out %d\n",
              s.mode.c_str(), s.arms.size(), s.seeds, s.workers, s.task.strategies, s.task.exec, s.task.options,
              s.task.length(), s.task.train_problems, s.task.test_problems);
  std::printf("output: %s\n", fs::absolute(out).string().c_str());
  std::fflush(stdout);

  // Jobs: per seed the base policy and every arm; results kept in job order.
  struct job {
    int seed;
    std::string arm;  // "base" = the base policy's evaluation
  };
  std::vector<job> jobs;
  for (int seed = 1; seed <= s.seeds; ++seed) {
    jobs.push_back({seed, "base"});
    for (const auto& a : s.arms) jobs.push_back({seed, a});
  }
  std::vector<run_result> results(jobs.size());
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex io;
  std::string failure;
  auto worker = [&] {
    for (;;) {
      const std::size_t j = next++;
      if (j >= jobs.size()) return;
      try {
        const instance in = make_instance(s.task, static_cast<uint64_t>(jobs[j].seed));
        results[j] = jobs[j].arm == "base" ? base_result(in)
                                           : train(in, find_arm(jobs[j].arm), s.train, static_cast<uint64_t>(jobs[j].seed));
        results[j].seed = static_cast<uint64_t>(jobs[j].seed);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(io);
        failure = jobs[j].arm + " seed " + std::to_string(jobs[j].seed) + ": " + e.what();
        next = jobs.size();
        return;
      }
      const std::size_t k = ++done;
      if (k % std::max<std::size_t>(1, jobs.size() / 20) == 0 || k == jobs.size()) {
        std::lock_guard<std::mutex> g(io);
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("  [%zu/%zu runs, %.0f s elapsed, ETA %.0f s]\n", k, jobs.size(), el,
                    el / k * (jobs.size() - k));
        std::fflush(stdout);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < std::max(1, s.workers); ++w) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (!failure.empty()) {
    std::fprintf(stderr, "reco_tree_study: %s\n", failure.c_str());
    return 1;
  }

  std::map<std::string, std::map<uint64_t, const run_result*>> by_arm;
  std::map<std::string, std::vector<const run_result*>> list;
  std::vector<std::string> order = {"base"};
  for (const auto& a : s.arms) order.push_back(a);
  for (const auto& r : results) {
    by_arm[r.arm][r.seed] = &r;
    list[r.arm].push_back(&r);
  }

  // ---- CSV files --------------------------------------------------------------------------
  const auto& ks = eval_ks();
  {
    std::ofstream f(out / "tree_runs.csv");
    f << "arm,seed";
    for (int k : ks) f << ",pass" << k;
    f << ",common_only_pass1024,both_pass1024,rare_only_pass1024,pool_pass1,pool_pass1024,token_entropy,seq_entropy,"
         "kl,fig1_shift,effective_correct,pool_token_entropy,reward_first,reward_last,slope,rich_share,"
         "rich_distinct_share,repeats,neg_pos_mass,cos_grpo_reco,cos_own_grpo,reco_weight_exponent,own_weight_exponent,clip_frac,"
         "cap_hits,groups_used\n";
    for (const auto& r : results) {
      f << r.arm << "," << r.seed;
      for (double p : r.test.pass) f << "," << num(p, 6);
      for (int c = 0; c < 3; ++c) f << "," << num(r.test_pass_by_class[c].empty() ? NAN : r.test_pass_by_class[c][10], 6);
      f << "," << num(r.pool.pass[0], 6) << "," << num(r.pool.pass[10], 6) << "," << num(r.test.token_entropy, 6)
        << "," << num(r.test.seq_entropy, 6) << "," << num(r.test.kl, 6) << "," << num(r.test.fig1_shift, 6) << ","
        << num(r.test.effective_correct, 6) << "," << num(r.pool.token_entropy, 6) << ","
        << num(r.arm == "base" ? NAN : r.reward_first, 6) << "," << num(r.arm == "base" ? NAN : r.reward_last, 6)
        << "," << num(r.slope_den > 0 ? r.slope_num / r.slope_den : NAN, 6) << ","
        << num(r.pos_mass > 0 ? r.pos_mass_rich / r.pos_mass : NAN, 6) << ","
        << num(r.distinct > 0 ? r.distinct_rich / r.distinct : NAN, 6) << ","
        << num(r.distinct > 0 ? r.correct_samples / r.distinct : NAN, 6) << ","
        << num(r.pos_mass > 0 ? r.neg_mass / r.pos_mass : NAN, 6) << ","
        << num(r.cos_n ? r.cos_grpo_reco / r.cos_n : NAN, 6) << "," << num(r.cos_n ? r.cos_own_grpo / r.cos_n : NAN, 6)
        << "," << num(r.wexp_reco_den > 0 ? r.wexp_reco_num / r.wexp_reco_den : NAN, 6) << ","
        << num(r.wexp_own_den > 0 ? r.wexp_own_num / r.wexp_own_den : NAN, 6) << "," << num(r.clip_frac, 6) << ","
        << num(r.cap_hits, 0) << "," << num(r.groups_used, 0) << "\n";
    }
  }
  {
    std::ofstream f(out / "tree_trajectory.csv");
    f << "arm,seed,step,pass1,pass64,pass256,pass1024,kl,token_entropy,reward\n";
    for (const auto& r : results)
      for (const auto& p : r.trajectory)
        f << r.arm << "," << r.seed << "," << p.step << "," << num(p.pass1, 6) << "," << num(p.pass64, 6) << ","
          << num(p.pass256, 6) << "," << num(p.pass1024, 6) << "," << num(p.kl, 6) << "," << num(p.token_entropy, 6)
          << "," << num(p.reward, 6) << "\n";
  }
  {
    std::ofstream f(out / "tree_update_bins.csv");
    f << "arm,p_old_low,p_old_high,tokens,mean_abs_grad,clip_frac\n";
    for (const auto& a : s.arms) {
      for (std::size_t b = 0; b + 1 < p_bins().size(); ++b) {
        double g = 0, c = 0, n = 0;
        for (auto* r : list[a]) g += r->bin_grad[b], c += r->bin_clip[b], n += r->bin_tokens[b];
        f << a << "," << num(p_bins()[b], 2) << "," << num(std::min(1.0, p_bins()[b + 1]), 2) << "," << num(n, 0)
          << "," << num(n > 0 ? g / n : NAN, 6) << "," << num(n > 0 ? c / n : NAN, 6) << "\n";
      }
    }
  }
  {
    std::ofstream f(out / "tree_fig1.csv");
    f << "arm,base_logp_per_token,density\n";
    for (const auto& a : order) {
      if (!list.count(a)) continue;
      for (int b = 0; b < fig1_range::bins; ++b) {
        double d = 0;
        for (auto* r : list[a]) d += r->fig1[b];
        const double x = fig1_range::lo + (b + 0.5) * (fig1_range::hi - fig1_range::lo) / fig1_range::bins;
        f << a << "," << num(x, 3) << "," << num(d / list[a].size(), 6) << "\n";
      }
    }
  }
  const std::vector<tree_verdict> verdicts = evaluate_tree_claims(tree_claims(), by_arm);
  {
    std::ofstream f(out / "tree_verdicts.csv");
    f << "id,claim,treatment,control,metric,n,excluded,delta,lo,hi,se,p,p_holm,multiplier,detectable,verdict\n";
    for (const auto& v : verdicts) {
      const double k = shown_scale(v.c);
      f << v.c.id << ",\"" << v.c.text << "\"," << v.c.treatment << "," << v.c.control << "," << v.c.metric << ","
        << v.r.n << "," << v.excluded << "," << num(k * v.r.mean, 4) << "," << num(k * v.r.lo, 4) << ","
        << num(k * v.r.hi, 4) << "," << num(k * v.r.se, 4) << "," << num(v.r.p, 5) << "," << num(v.p_holm, 5) << ","
        << num(v.multiplier, 3) << "," << num(k * v.mde, 4) << "," << v.verdict << "\n";
    }
  }

  // ---- Report -------------------------------------------------------------------------------
  std::ostringstream rep;
  rep << "# The strategy-tree study\n\n" << s.arms.size() << " arms × " << s.seeds
      << " seeds (each seed: its own task instance and base policy, shared by every arm), mode " << s.mode
      << ". Settings: `settings.txt`. Every value is exact (enumeration of every response), held-out problems unless "
         "named otherwise.\n\n";
  rep << "## Verdicts\n\nΔ = treatment − control per seed (points for Pass@k), mean with a 95 % t interval on n − 1 "
         "degrees of freedom; p two-sided, Holm-adjusted within the primary (P) and the secondary (S, M) family; "
         "the detectable Δ is (t_{1−α/(2m)} + t_{0.8}) · SE, the multiplier given.\n\n";
  rep << "| claim | Δ | 95 % CI | p (Holm) | detectable Δ (multiplier) | n (excluded) | verdict |\n"
         "|---|---:|---:|---:|---:|---:|---|\n";
  for (const auto& v : verdicts) {
    const double k = shown_scale(v.c);
    const int dg = k > 1 ? 2 : 4;
    rep << "| " << v.c.id << " " << v.c.text << " | " << signed_num(k * v.r.mean, dg) << " | ["
        << signed_num(k * v.r.lo, dg) << ", " << signed_num(k * v.r.hi, dg) << "] | "
        << (std::isnan(v.p_holm) ? "–" : num(v.p_holm, 4)) << " | " << num(k * v.mde, dg) << " ("
        << num(v.multiplier, 2) << ") | " << v.r.n << " (" << v.excluded << ") | **" << v.verdict << "** |\n";
  }
  rep << "\nE1–E5 and the arms \"correct answers only\" were added after the pre-registered results were seen "
         "(exploratory, a Holm family of their own).\n";
  rep << "\n## Pass@k and the policy at the end of training (mean ± sd over seeds)\n\n| arm |";
  const std::vector<int> show = {1, 4, 16, 64, 256, 1024};
  for (int k : show) rep << " Pass@" << k << " |";
  rep << " token entropy | KL to base | eff. correct | Figure 1 shift | pool Pass@1 | reward first → last |\n|---|";
  for (std::size_t j = 0; j < show.size() + 6; ++j) rep << "---:|";
  rep << "\n";
  auto cell = [&](const std::vector<const run_result*>& rs, auto f, double k, int dg) {
    auto [m, sd] = mean_sd(rs, f);
    return num(k * m, dg) + " ± " + num(k * sd, dg);
  };
  for (const auto& a : order) {
    if (!list.count(a)) continue;
    const auto& rs = list[a];
    rep << "| " << label_of(a) << " |";
    for (int k : show) {
      std::size_t j = 0;
      while (ks[j] != k) ++j;
      rep << " " << cell(rs, [j](const run_result& r) { return r.test.pass[j]; }, 100, 1) << " |";
    }
    rep << " " << cell(rs, [](const run_result& r) { return r.test.token_entropy; }, 1, 3) << " | "
        << cell(rs, [](const run_result& r) { return r.test.kl; }, 1, 3) << " | "
        << cell(rs, [](const run_result& r) { return r.test.effective_correct; }, 1, 2) << " | "
        << cell(rs, [](const run_result& r) { return r.test.fig1_shift; }, 1, 3) << " | "
        << cell(rs, [](const run_result& r) { return r.pool.pass[0]; }, 100, 1) << " | ";
    if (a == "base") rep << " |\n";
    else
      rep << num(mean_sd(rs, [](const run_result& r) { return r.reward_first; }).first, 2) << " → "
          << num(mean_sd(rs, [](const run_result& r) { return r.reward_last; }).first, 2) << " |\n";
  }
  // Figure 1's low tail: the share of the correct answers' probability mass whose base
  // log-likelihood per token lies below -0.6 (from the pooled histograms).
  rep << "\nFigure 1's low tail (`tree_fig1.csv`, plot `tree_fig1.png`): share of the correct answers' probability mass "
         "whose base log-likelihood per token is below −0.6, mean over seeds:\n\n| arm | tail share |\n|---|---:|\n";
  for (const auto& a : order) {
    if (!list.count(a)) continue;
    const double width = (fig1_range::hi - fig1_range::lo) / fig1_range::bins;
    const double share = mean_sd(list[a], [&](const run_result& r) {
                           double t = 0;
                           for (int b = 0; b < fig1_range::bins; ++b)
                             if (fig1_range::lo + (b + 1) * width <= -0.6 + 1e-12) t += r.fig1[b] * width;
                           return t;
                         }).first;
    rep << "| " << label_of(a) << " | " << num(100 * share, 2) << " % |\n";
  }
  rep << "\nPass@1024 by class of held-out problem (mean over seeds):\n\n| arm | common_only | both | rare_only |\n"
         "|---|---:|---:|---:|\n";
  for (const auto& a : order) {
    if (!list.count(a)) continue;
    rep << "| " << label_of(a) << " |";
    for (int c = 0; c < 3; ++c)
      rep << " " << num(100 * mean_sd(list[a], [c](const run_result& r) {
                     return r.test_pass_by_class[c].empty() ? NAN : r.test_pass_by_class[c][10]; }).first, 1) << " |";
    rep << "\n";
  }
  rep << "\n## The mechanism, measured (mean over seeds)\n\n"
         "- slope: within a problem, over its correct answers, Δlog π(y) of a step on log π_old(y) (pooled over "
         "problems and steps; > 0 is rich-get-richer);\n"
         "- rich share: share of the positive-advantage gradient mass (|Σ_t ∂ℓ/∂logp_t| of the arm's objective, "
         "on-policy) carried by correct answers above the median π_old of their problem's correct answers; "
         "distinct share: their share of the distinct correct answers sampled; repeats: correct samples per "
         "distinct correct answer (mixed groups); − / + mass: the negative-advantage gradient mass (incorrect "
         "answers) over the positive one in the same groups (added after the pre-registration, exploratory);\n"
         "- cos: cosine between GRPO's and ReCo's parameter gradients on the same on-policy batch; cos(own, GRPO) "
         "the arm's own against GRPO's;\n"
         "- weight exponent: slope of log w on log π_old(y) of the response weight implied by the objective "
         "(coefficient against GRPO's, no KL term, uncapped responses): ReCo's weight (measured on every arm's "
         "batches) and the arm's own (token-ratio arms); a distinct response's expected weight then scales as "
         "π^(1 + exponent).\n\n";
  rep << "| arm | slope | rich share | distinct share | repeats | − / + mass | cos(GRPO, ReCo) | cos(own, GRPO) | "
         "ReCo weight exponent | own weight exponent | clip frac | cap hits / run |\n|---|---:|---:|---:|---:|---:|---:|"
         "---:|---:|---:|---:|---:|\n";
  for (const auto& a : s.arms) {
    const auto& rs = list[a];
    auto m = [&](auto f, int dg) { return num(mean_sd(rs, f).first, dg); };
    rep << "| " << label_of(a) << " | "
        << m([](const run_result& r) { return r.slope_den > 0 ? r.slope_num / r.slope_den : NAN; }, 4) << " | "
        << m([](const run_result& r) { return r.pos_mass > 0 ? r.pos_mass_rich / r.pos_mass : NAN; }, 3) << " | "
        << m([](const run_result& r) { return r.distinct > 0 ? r.distinct_rich / r.distinct : NAN; }, 3) << " | "
        << m([](const run_result& r) { return r.distinct > 0 ? r.correct_samples / r.distinct : NAN; }, 2) << " | "
        << m([](const run_result& r) { return r.pos_mass > 0 ? r.neg_mass / r.pos_mass : NAN; }, 3) << " | "
        << m([](const run_result& r) { return r.cos_n ? r.cos_grpo_reco / r.cos_n : NAN; }, 3) << " | "
        << m([](const run_result& r) { return r.cos_n ? r.cos_own_grpo / r.cos_n : NAN; }, 3) << " | "
        << m([](const run_result& r) { return r.wexp_reco_den > 0 ? r.wexp_reco_num / r.wexp_reco_den : NAN; }, 4)
        << " | "
        << m([](const run_result& r) { return r.wexp_own_den > 0 ? r.wexp_own_num / r.wexp_own_den : NAN; }, 4)
        << " | " << m([](const run_result& r) { return r.clip_frac; }, 4) << " | "
        << m([](const run_result& r) { return r.cap_hits; }, 0) << " |\n";
  }
  rep << "\nUpdate scale by p_old: mean |∂ℓ/∂logp| per token (times the call's token count, so that aggregations "
         "compare) and the clip fraction, over every PPO update (`tree_update_bins.csv`):\n\n| arm |";
  for (std::size_t b = 0; b + 1 < p_bins().size(); ++b)
    rep << " p_old ∈ [" << num(p_bins()[b], 2) << ", " << num(std::min(1.0, p_bins()[b + 1]), 2) << ") |";
  rep << "\n|---|";
  for (std::size_t b = 0; b + 1 < p_bins().size(); ++b) rep << "---:|";
  rep << "\n";
  for (const auto& a : s.arms) {
    rep << "| " << label_of(a) << " |";
    for (std::size_t b = 0; b + 1 < p_bins().size(); ++b) {
      double g = 0, c = 0, n = 0;
      for (auto* r : list[a]) g += r->bin_grad[b], c += r->bin_clip[b], n += r->bin_tokens[b];
      rep << " " << num(n > 0 ? g / n : NAN, 3) << " (clip " << num(n > 0 ? 100 * c / n : NAN, 1) << " %) |";
    }
    rep << "\n";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep << "\nWall time of the study: " << num(secs, 0) << " s (" << s.workers << " worker threads).\n";
  {
    std::ofstream f(out / "tree_report.md");
    f << rep.str();
  }

  // ---- Console: the verdict table and the mechanism --------------------------------------------
  std::printf("\nstrategy tree: verdicts (Δ per seed, 95 %% t CI, Holm-adjusted p, detectable Δ):\n");
  for (const auto& v : verdicts) {
    const double k = shown_scale(v.c);
    const int dg = k > 1 ? 2 : 4;
    std::printf("  %-4s %-72s Δ %s [%s, %s]  p %s  MDE %s  n %d  %s\n", v.c.id.c_str(), v.c.text.c_str(),
                signed_num(k * v.r.mean, dg).c_str(), signed_num(k * v.r.lo, dg).c_str(),
                signed_num(k * v.r.hi, dg).c_str(), std::isnan(v.p_holm) ? "  –  " : num(v.p_holm, 4).c_str(),
                num(k * v.mde, dg).c_str(), v.r.n, v.verdict.c_str());
  }
  std::printf("\nstrategy tree: the mechanism (means over seeds)\n  %-16s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n",
              "arm", "slope", "rich", "distinct", "repeats", "-/+ mass", "cos G/R", "ReCo wx", "own wx", "entropy",
              "P@1024");
  for (const auto& a : s.arms) {
    const auto& rs = list[a];
    auto m = [&](auto f) { return mean_sd(rs, f).first; };
    std::printf("  %-16s %8.4f %8.3f %8.3f %8.2f %8.3f %8.3f %8.4f %8.4f %8.3f %8.2f\n", a.c_str(),
                m([](const run_result& r) { return r.slope_den > 0 ? r.slope_num / r.slope_den : NAN; }),
                m([](const run_result& r) { return r.pos_mass > 0 ? r.pos_mass_rich / r.pos_mass : NAN; }),
                m([](const run_result& r) { return r.distinct > 0 ? r.distinct_rich / r.distinct : NAN; }),
                m([](const run_result& r) { return r.distinct > 0 ? r.correct_samples / r.distinct : NAN; }),
                m([](const run_result& r) { return r.pos_mass > 0 ? r.neg_mass / r.pos_mass : NAN; }),
                m([](const run_result& r) { return r.cos_n ? r.cos_grpo_reco / r.cos_n : NAN; }),
                m([](const run_result& r) { return r.wexp_reco_den > 0 ? r.wexp_reco_num / r.wexp_reco_den : NAN; }),
                m([](const run_result& r) { return r.wexp_own_den > 0 ? r.wexp_own_num / r.wexp_own_den : NAN; }),
                m([](const run_result& r) { return r.test.token_entropy; }),
                100 * m([](const run_result& r) { return r.test.pass[10]; }));
  }
  std::printf("  base entropy %.3f, base Pass@1024 %.2f\n",
              mean_sd(list["base"], [](const run_result& r) { return r.test.token_entropy; }).first,
              100 * mean_sd(list["base"], [](const run_result& r) { return r.test.pass[10]; }).first);
#ifdef RECO_TREE_PLOTS
  {
    // The first interpreter with matplotlib, as for the Countdown study: $RECO_ABLATION_PYTHON,
    // python3 on the PATH, the system's /usr/bin/python3 (Debian's python3-matplotlib).
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("RECO_ABLATION_PYTHON")) candidates.push_back(env);
    candidates.push_back("python3");
    candidates.push_back("/usr/bin/python3");
    std::string python;
    for (const auto& c : candidates)
      if (std::system(("'" + c + "' -c 'import matplotlib' > /dev/null 2>&1").c_str()) == 0) {
        python = c;
        break;
      }
    int rc = 1;
    if (!python.empty())
      rc = std::system(("'" + python + "' '" RECO_TREE_PLOTS "' '" + out.string() + "' > '" +
                        (out / "plots.log").string() + "' 2>&1").c_str());
    std::printf("plots: %s\n", rc == 0 ? (out / "plots").string().c_str()
                                       : python.empty() ? "not drawn (no python3 with matplotlib)"
                                                        : "not drawn (see plots.log)");
  }
#endif
  std::printf("report: %s (%.0f s)\n", (out / "tree_report.md").string().c_str(), secs);
  return 0;
}

}  // namespace tree

int main(int argc, char** argv) {
  using namespace tree;
  // One OpenMP thread inside each objective call: the workers are the parallelism, and the
  // results must not depend on the machine's core count (reductions sum in thread order).
  setenv("OMP_NUM_THREADS", "1", 1);
  try {
    study s = preregistered();
    fs::path out = "results/tree";
    std::vector<std::pair<std::string, std::string>> sets;
    std::string seeds, workers, arm_list;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--out") out = value();
      else if (a == "--seeds") seeds = value();
      else if (a == "--workers") workers = value();
      else if (a == "--arms") arm_list = value();
      else if (a == "--smoke") s.mode = "smoke";
      else if (a == "--full") s.mode = "full";
      else if (a == "--set") {
        const std::string kv = value();
        const auto eq = kv.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("--set needs key=value");
        sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      } else if (a == "--help" || a == "-h") {
        std::printf("usage: reco_tree_study [--out DIR] [--seeds N] [--arms a,b,...] [--workers N] [--smoke | --full]\n"
                    "                       [--set task.key=value | train.key=value ...]  (keys: DIR/settings.txt)\n");
        return 0;
      } else {
        throw std::invalid_argument("unknown argument '" + a + "' (see --help)");
      }
    }
    if (s.mode == "smoke") {
      s.seeds = 3;
      s.task.train_problems = 16;
      s.task.test_problems = 32;
      s.train.steps = 6;
      s.train.prompts = 4;
      s.train.eval_every = 2;
    } else if (s.mode == "full") {
      s.seeds = 128;
    }
    if (!seeds.empty()) s.seeds = std::stoi(seeds);
    if (!workers.empty()) s.workers = std::stoi(workers);
    if (!arm_list.empty()) {
      s.arms.clear();
      std::stringstream ss(arm_list);
      std::string x;
      while (std::getline(ss, x, ',')) s.arms.push_back(x);
    }
    for (const auto& [k, v] : sets) assign(s, k, v);
    if (s.seeds < 1 || s.workers < 1) throw std::invalid_argument("--seeds and --workers must be at least 1");
    return run(s, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reco_tree_study: %s\n", e.what());
    return 1;
  }
}
