// reco ablation study: ten GRPO-family objectives, all computed by reco through its LibTorch
// adapter, trained from one pretrained base policy on a built-in Countdown task and evaluated
// with reco::eval. See docs/ablation.md.
//
//   reco_ablation [--out DIR] [--default | --full | --smoke] [--device cpu|cuda] [--workers N] [--threads N]
//                 [--ranks N] [--seeds N] [--configs grpo,reco,...] [--set key=value ...] [--fresh-base]
//
// The main process prepares the data, pretrains (or loads) the base policy, then runs one worker
// process per (configuration, seed) and one for the base policy's evaluation, at most --workers
// at a time, and finally writes the report. Workers are this program with --worker JOB. With
// --ranks N a training job runs as N data-parallel processes (ranks.hpp, rl.hpp: train_rl).
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "countdown.hpp"
#include "evaluate.hpp"
#include "io.hpp"
#include "model.hpp"
#include "pretrain.hpp"
#include "ranks.hpp"
#include "report.hpp"
#include "rl.hpp"
#include "settings.hpp"

extern char** environ;

namespace ablation {
namespace fs = std::filesystem;

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The three presets of the study's size (docs/ablation.md). The default: GRPO and ReCo on 4 base
// policies x 3 seeds, the two single corrections on 4 x 1 (about 20 minutes on 2 cores). --full:
// every configuration, 8 base policies, 8 seeds for the primary comparison and 2 for the others.
void apply_mode(study_settings& s, const std::string& mode) {
  s.mode = mode;
  if (mode == "default") {
    s.configs = {"grpo", "reco", "response_only", "token_only"};
  } else if (mode == "full") {
    s.bases = 8;
    s.seeds = 8;
    s.secondary_seeds = 2;
  } else if (mode == "smoke") {
    s.bases = 1;
    s.seeds = 1;
    s.secondary_seeds = 1;
    s.test_problems = 8;
    s.train_problems = 64;
    s.model.d_model = 32;
    s.model.layers = 1;
    s.model.heads = 2;
    s.model.d_ff = 64;
    s.pretrain.steps = 30;
    s.pretrain.batch = 64;
    s.rl.steps = 2;
    s.rl.prompts = 4;
    s.eval.samples = 16;
    s.eval.variance_rollouts = 2;
    s.eval.likelihood_samples = 64;
  }
}

// Intra-op threads for LibTorch and, when the BLAS underneath is OpenBLAS (looked up at run
// time: Debian's LibTorch links whichever libblas the system provides), for OpenBLAS too.
void set_threads(int n) {
  torch::set_num_threads(n);
  using setter = void (*)(int);
  if (auto f = reinterpret_cast<setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

// How long a collective of the --ranks processes may wait for a rank: the ranks do the same work
// between collectives, so only a rank that died makes the others wait this long.
constexpr int rank_timeout_ms = 300000;

torch::Device device_of(const study_settings& s) {
  if (s.device == "cuda") {
    if (!torch::cuda::is_available()) throw std::runtime_error("--device cuda: this LibTorch sees no CUDA device");
    return torch::Device(torch::kCUDA);
  }
  if (s.device != "cpu") throw std::invalid_argument("--device must be cpu or cuda");
  return torch::Device(torch::kCPU);
}

// Base policy b (1-based) is pretrained with seed pretrain.seed + b - 1; everything else equal.
study_settings base_settings(const study_settings& s, int b) {
  study_settings t = s;
  t.pretrain.seed = s.pretrain.seed + static_cast<uint64_t>(b - 1);
  return t;
}

// Keyed by the settings that determine the base policy and, on the CPU, by the BLAS kernels
// (blas.hpp): a policy pretrained with other kernels is another policy.
std::string base_model_path(const fs::path& out, const study_settings& s, int b) {
  study_settings t = base_settings(s, b);
  const std::string blas = s.device == "cpu" ? blas_tag() : "";
  return (out / "cache" / ("base_" + t.base_model_key() + blas + ".pt")).string();
}

// A worker's job: "pretrain_b<b>", "base_b<b>" (the base policy's evaluation) or
// "<config>_b<b>_s<seed>" (one training run).
struct job_id {
  std::string config;  // "pretrain", "base" or an algorithm name
  int base = 1;
  uint64_t seed = 0;
};

std::string job_name(const std::string& config, int base, uint64_t seed = 0) {
  std::string n = config + "_b" + std::to_string(base);
  if (config != "base" && config != "pretrain") n += "_s" + std::to_string(seed);
  return n;
}

job_id parse_job(const std::string& job) {
  job_id j;
  std::string rest = job;
  const auto s = rest.rfind("_s");
  const auto b = rest.rfind("_b");
  if (b == std::string::npos) throw std::invalid_argument("bad job name '" + job + "'");
  if (s != std::string::npos && s > b) {
    j.seed = std::stoull(rest.substr(s + 2));
    rest = rest.substr(0, s);
  }
  j.base = std::stoi(rest.substr(b + 2));
  j.config = rest.substr(0, b);
  return j;
}

transformer make_model(const study_settings& s, uint64_t seed) {
  torch::manual_seed(seed);
  return transformer(s.model);
}

// ------------------------------------------------------------------------------------------
// Worker: one configuration and seed (or the base policy), results under runs/<job>/.
// ------------------------------------------------------------------------------------------

void write_eval_files(const fs::path& dir, const std::vector<problem>& test, const eval_result& e,
                      const study_settings& s, double eval_seconds, double train_seconds) {
  {
    csv_writer w((dir / "eval.csv").string(),
                 {"problem", "class", "samples", "correct", "distinct_correct", "rare_correct"});
    for (std::size_t p = 0; p < test.size(); ++p)
      w.row({std::to_string(p), class_name(test[p].cls), std::to_string(s.eval.samples),
             std::to_string(e.problems[p].correct), std::to_string(e.problems[p].distinct_correct),
             std::to_string(e.problems[p].rare_correct)});
  }
  {
    csv_writer w((dir / "token_variance.csv").string(), {"segment", "mean", "standard_error", "tokens", "responses"});
    const char* names[3] = {"early", "middle", "late"};
    for (int b = 0; b < 3; ++b)
      w.row({names[b], exact(e.token_variance.mean[b]), exact(e.token_variance.standard_error[b]),
             std::to_string(e.token_variance.tokens[b]), std::to_string(e.token_variance.responses[b])});
  }
  {
    csv_writer w((dir / "base_likelihood.csv").string(), {"problem", "mean_base_logp"});
    for (std::size_t i = 0; i < e.base_likelihood.size(); ++i)
      w.row({std::to_string(e.base_likelihood_problem[i]), exact(e.base_likelihood[i])});
  }
  csv_writer w((dir / "summary.csv").string(), {"key", "value"});  // written last: marks the job done
  w.row({"self_bleu_correct", exact(e.self_bleu_correct)});
  w.row({"train_seconds", exact(train_seconds)});
  w.row({"eval_seconds", exact(eval_seconds)});
}

// A training job's ranks other than 0 (--ranks): the same training without any output.
[[noreturn]] void run_rank(const fs::path& out, const study_settings& s_in, const std::string& job,
                           const rank_set& ranks) {
  int code = 0;
  try {
    study_settings s = s_in;
    set_threads(s.threads);
    const torch::Device dev = device_of(s);
    generator gen(s.task);
    study_data data = make_study_data(gen, s);
    const job_id id = parse_job(job);
    transformer base = make_model(s, 0);
    load_model(base, base_model_path(out, s, id.base), dev);
    base->to(dev);
    base->eval();
    const algorithm& algo = find_algorithm(id.config);
    transformer policy = make_model(s, 0);
    load_model(policy, base_model_path(out, s, id.base), dev);
    policy->to(dev);
    torch::manual_seed(id.seed);
    train_rl(policy, base, gen, data.train, algo, s.rl, id.seed, dev, {}, ranks.group());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d of %s: %s\n", ranks.rank(), job.c_str(), e.what());
    code = 2;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

int run_worker(const fs::path& out, const std::string& job) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // a worker (and with it its ranks) ends with the main process
  study_settings s;
  s.load((out / "settings.txt").string());
  const job_id id = parse_job(job);
  // --ranks: fork the training job's other ranks now, before LibTorch starts any thread.
  rank_set ranks;
  if (id.config != "base" && id.config != "pretrain" && s.ranks > 1) {
    ranks.start(s.ranks, std::chrono::milliseconds(rank_timeout_ms));
    if (ranks.rank() > 0) run_rank(out, s, job, ranks);
  }
  set_threads(s.threads);
  const torch::Device dev = device_of(s);
  generator gen(s.task);
  study_data data = make_study_data(gen, s);
  if (id.config == "pretrain") {
    const study_settings bs = base_settings(s, id.base);
    transformer base = make_model(bs, bs.pretrain.seed);
    base->to(dev);
    pretrain(base, gen, bs.pretrain, data.test_keys, dev, [&](int step, double loss) {
      std::printf("@step %d %d %.4f 0\n", step, bs.pretrain.steps, loss);
      std::fflush(stdout);
    });
    // Written under a temporary name and renamed: a job waiting for this base sees it whole.
    const std::string path = base_model_path(out, s, id.base);
    save_model(base, path + ".part");
    fs::rename(path + ".part", path);
    std::printf("@done\n");
    return 0;
  }
  transformer base = make_model(s, 0);
  load_model(base, base_model_path(out, s, id.base), dev);
  base->to(dev);
  base->eval();

  const fs::path dir = out / "runs" / job;
  fs::create_directories(dir);
  if (id.config == "base") {
    const auto t0 = clock_type::now();
    std::printf("@phase eval\n");
    std::fflush(stdout);
    eval_result e = evaluate(base, base, gen, data.test, s.eval, 1, dev);
    write_eval_files(dir, data.test, e, s, seconds_since(t0), 0.0);
    std::printf("@done\n");
    return 0;
  }
  const algorithm& algo = find_algorithm(id.config);
  const uint64_t seed = id.seed;

  transformer policy = make_model(s, 0);
  load_model(policy, base_model_path(out, s, id.base), dev);
  policy->to(dev);
  torch::manual_seed(seed);
  const auto t0 = clock_type::now();
  csv_writer train((dir / "train.csv").string(),
                   {"step", "reward", "entropy", "abs_kl", "distinct2", "self_bleu", "path_uniqueness", "loss",
                    "clip_frac", "ppo_kl", "weight_mean", "weight_max", "cap_hits", "groups_used", "seconds",
                    "weight_spread", "rare_pos_uniform", "rare_pos_weighted", "rare_neg_uniform", "rare_neg_weighted",
                    "neg_pos_weighted", "ratio_gap"});
  train_rl(policy, base, gen, data.train, algo, s.rl, seed, dev, [&](const step_metrics& m) {
    train.row({std::to_string(m.step), exact(m.reward), exact(m.entropy), exact(m.abs_kl), exact(m.distinct2),
               exact(m.self_bleu), exact(m.path_uniqueness), exact(m.loss), exact(m.clip_frac), exact(m.ppo_kl),
               exact(m.weight_mean), exact(m.weight_max), exact(m.cap_hits), exact(m.groups_used),
               exact(m.seconds), exact_or_empty(m.weight_spread), exact_or_empty(m.rare_pos_uniform),
               exact_or_empty(m.rare_pos_weighted), exact_or_empty(m.rare_neg_uniform),
               exact_or_empty(m.rare_neg_weighted), exact_or_empty(m.neg_pos_weighted), exact(m.ratio_gap)});
    std::printf("@step %d %d %.4f %.3f\n", m.step, s.rl.steps, m.reward, m.seconds);
    std::fflush(stdout);
  }, ranks.group());
  train.close();
  if (s.ranks > 1 && ranks.join() > 0) throw std::runtime_error(job + ": a data-parallel rank failed");
  const double train_seconds = seconds_since(t0);
  std::printf("@phase eval\n");
  std::fflush(stdout);
  const auto t1 = clock_type::now();
  eval_result e = evaluate(policy, base, gen, data.test, s.eval, seed, dev);
  write_eval_files(dir, data.test, e, s, seconds_since(t1), train_seconds);
  std::printf("@done\n");
  return 0;
}

// ------------------------------------------------------------------------------------------
// Main process: data, base policy, worker scheduling with progress, report.
// ------------------------------------------------------------------------------------------

struct running_job {
  std::string name;
  pid_t pid = -1;
  int fd = -1;
  std::string buffer;
  clock_type::time_point start;
  double fraction = 0.0;  // estimated share of the job done
  int step = 0;
  double reward = 0.0;
  bool training = true;
  std::vector<std::string> tail;  // last lines of the worker's other output (for errors)
};

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

running_job spawn_worker(const fs::path& out, const std::string& job, int threads) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::string exe = self_exe(), outs = out.string();
  std::vector<std::string> args = {exe, "--worker", job, "--out", outs};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Workers run single-threaded BLAS and OpenMP unless --threads says otherwise: two busy
  // processes on two cores, and results that do not depend on the number of cores.
  std::vector<std::string> env_store;
  const std::string t = std::to_string(threads);
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("OPENBLAS_NUM_THREADS=", 0) == 0 || kv.rfind("OMP_NUM_THREADS=", 0) == 0 ||
        kv.rfind("MKL_NUM_THREADS=", 0) == 0)
      continue;
    env_store.push_back(kv);
  }
  for (const char* k : {"OPENBLAS_NUM_THREADS=", "OMP_NUM_THREADS=", "MKL_NUM_THREADS="}) env_store.push_back(k + t);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  running_job r;
  r.name = job;
  r.start = clock_type::now();
  if (posix_spawn(&r.pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0)
    throw std::runtime_error("cannot start a worker process");
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  r.fd = fds[0];
  return r;
}

// The plain summary at the end of the console output: every claim's verdict (the report has the
// intervals, the method and the runs behind each).
void print_verdicts(const std::vector<claim_result>& verdicts) {
  std::printf("\nverdicts on the paper's claims (Δ in points, 95 %% bootstrap CI, Holm-adjusted p):\n");
  for (const auto& v : verdicts) {
    if (v.verdict == "not run") {
      std::printf("  %-4s %-62s not run\n", v.c.id.c_str(), v.c.text.c_str());
      continue;
    }
    const std::string p = std::isnan(v.p_adjusted) ? "  –  " : fixed(v.p_adjusted, 3);
    std::printf("  %-4s %-62s Δ %+6.1f [%+6.1f, %+6.1f]  p %s  %s\n", v.c.id.c_str(), v.c.text.c_str(),
                100 * v.delta, 100 * v.lo, 100 * v.hi, p.c_str(), v.verdict.c_str());
  }
}

int run_main(study_settings s, const fs::path& out, bool fresh_base, bool report_only) {
  const auto t_start = clock_type::now();
  s.finalise();
  fs::create_directories(out / "cache");
  fs::create_directories(out / "runs");
  {
    std::ofstream f(out / "settings.txt");
    f << s.serialise();
  }
  // One intra-op thread by default: on two cores shared with the workers (or other load), more
  // threads oversubscribe and run several times slower.
  set_threads(s.threads);
  (void)device_of(s);  // fails early on an unknown or unavailable device
  std::printf("reco ablation study (%s): %zu configurations x %d base policies x %d seeds (GRPO, ReCo) / %d seeds "
              "(others), device %s, %d worker(s) of %d rank(s)\n",
              s.mode.c_str(), s.config_names().size(), s.bases, s.seeds, s.secondary_seeds, s.device.c_str(),
              s.workers, s.ranks);
  std::printf("output: %s\n", fs::absolute(out).string().c_str());

  generator gen(s.task);
  study_data data = make_study_data(gen, s);
  std::array<int, 3> cls{};
  for (const auto& p : data.test) ++cls[static_cast<int>(p.cls)];
  std::printf("task: Countdown-%d, %zu held-out problems (%d common_only, %d both, %d rare_only), RL pool %zu\n",
              s.task.numbers, data.test.size(), cls[0], cls[1], cls[2], data.train.size());

  if (report_only) {
    // --report-only: the report from the runs already in <out>/runs (the settings given must be
    // the ones they were run with).
    const std::vector<claim_result> verdicts = write_report(out, s, data, 0.0);
    print_verdicts(verdicts);
    std::printf("report: %s\n", (out / "report.md").string().c_str());
    return 0;
  }
  // Base policies: cached by the settings that determine them; the missing ones are pretrained
  // by worker jobs, in parallel. A job that needs base b starts once b's file exists.
  std::deque<std::string> pending;
  for (int b = 1; b <= s.bases; ++b) {
    const std::string path = base_model_path(out, s, b);
    if (fresh_base && fs::exists(path)) fs::remove(path);
    if (!fs::exists(path)) {
      pending.push_back(job_name("pretrain", b));
      std::printf("base policy %d: pretraining (%s, %d steps of %d demonstrations, seed %llu)\n", b,
                  s.model.describe().c_str(), s.pretrain.steps, s.pretrain.batch,
                  static_cast<unsigned long long>(base_settings(s, b).pretrain.seed));
    } else {
      std::printf("base policy %d: loaded from cache %s\n", b, path.c_str());
    }
  }
  std::fflush(stdout);
  // Then per base policy its evaluation and configuration x seed, seed-major so that an early
  // look at the runs directory already covers every configuration.
  for (int b = 1; b <= s.bases; ++b) pending.push_back(job_name("base", b));
  for (int seed = 1; seed <= std::max(s.seeds, s.secondary_seeds); ++seed)
    for (int b = 1; b <= s.bases; ++b)
      for (const auto& c : s.config_names())
        if (seed <= s.seeds_of(c)) pending.push_back(job_name(c, b, static_cast<uint64_t>(seed)));
  const std::size_t total_jobs = pending.size();
  std::vector<running_job> running;
  std::vector<double> finished_train_jobs;  // durations
  std::size_t done = 0;
  const auto t_jobs = clock_type::now();
  auto last_print = clock_type::now() - std::chrono::seconds(60);
  bool failed = false;
  std::string failure;

  auto estimate_left = [&]() {
    // Mean duration of a finished training job, else extrapolated from running jobs' progress.
    double per_job = 0.0;
    if (!finished_train_jobs.empty()) {
      for (double d : finished_train_jobs) per_job += d;
      per_job /= finished_train_jobs.size();
    } else {
      for (const auto& r : running)
        if (parse_job(r.name).config != "base" && parse_job(r.name).config != "pretrain" && r.fraction > 0.02)
          per_job = std::max(per_job, seconds_since(r.start) / r.fraction);
    }
    if (per_job <= 0) return -1.0;
    double work = static_cast<double>(pending.size()) * per_job;
    for (const auto& r : running) work += per_job * (1.0 - r.fraction);
    const std::size_t busy = std::min<std::size_t>(static_cast<std::size_t>(std::max(1, s.workers)),
                                                   pending.size() + running.size());
    return work / static_cast<double>(std::max<std::size_t>(1, busy));
  };

  while ((!pending.empty() || !running.empty()) && !failed) {
    while (static_cast<int>(running.size()) < s.workers) {
      // The first pending job whose base policy is ready (pretraining jobs always are).
      auto it = std::find_if(pending.begin(), pending.end(), [&](const std::string& j) {
        const job_id id = parse_job(j);
        return id.config == "pretrain" || fs::exists(base_model_path(out, s, id.base));
      });
      if (it == pending.end()) break;
      running.push_back(spawn_worker(out, *it, s.threads));
      pending.erase(it);
    }
    std::vector<pollfd> pfds;
    for (const auto& r : running) pfds.push_back({r.fd, POLLIN, 0});
    poll(pfds.data(), pfds.size(), 1000);
    for (std::size_t i = 0; i < running.size(); ++i) {
      running_job& r = running[i];
      if (!(pfds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = read(r.fd, buf, sizeof buf);
      if (n > 0) {
        r.buffer.append(buf, static_cast<std::size_t>(n));
        std::size_t nl;
        while ((nl = r.buffer.find('\n')) != std::string::npos) {
          const std::string line = r.buffer.substr(0, nl);
          r.buffer.erase(0, nl + 1);
          int step = 0, steps = 1;
          double reward = 0, sec = 0;
          if (std::sscanf(line.c_str(), "@step %d %d %lf %lf", &step, &steps, &reward, &sec) == 4) {
            r.step = step;
            r.reward = reward;
            r.fraction = 0.6 * step / steps;  // evaluation takes roughly the remaining share
          } else if (line == "@phase eval") {
            r.training = false;
            if (parse_job(r.name).config != "base") r.fraction = 0.6;
          } else if (line != "@done") {
            r.tail.push_back(line);
            if (r.tail.size() > 20) r.tail.erase(r.tail.begin());
          }
        }
        continue;
      }
      // End of output: reap the worker.
      int status = 0;
      waitpid(r.pid, &status, 0);
      close(r.fd);
      const double took = seconds_since(r.start);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        failed = true;
        failure = "worker '" + r.name + "' failed:\n";
        for (const auto& l : r.tail) failure += "  " + l + "\n";
      } else {
        ++done;
        const std::string kind = parse_job(r.name).config;
        if (kind != "base" && kind != "pretrain") finished_train_jobs.push_back(took);
        std::printf("[%zu/%zu] %-22s finished in %s\n", done, total_jobs, r.name.c_str(), duration_text(took).c_str());
        std::fflush(stdout);
      }
      running.erase(running.begin() + static_cast<long>(i));
      pfds.erase(pfds.begin() + static_cast<long>(i));
      --i;
    }
    if (seconds_since(last_print) >= 5.0 && !running.empty()) {
      last_print = clock_type::now();
      std::string line;
      for (const auto& r : running) {
        char b[160];
        const std::string kind = parse_job(r.name).config;
        if (kind == "pretrain")
          std::snprintf(b, sizeof b, "%s: step %d/%d", r.name.c_str(), r.step, s.pretrain.steps);
        else if (kind == "base" || !r.training)
          std::snprintf(b, sizeof b, "%s: evaluating", r.name.c_str());
        else
          std::snprintf(b, sizeof b, "%s: step %d/%d reward %.3f", r.name.c_str(), r.step, s.rl.steps, r.reward);
        line += (line.empty() ? "" : " | ") + std::string(b);
      }
      const double left = estimate_left();
      std::printf("  [%zu/%zu done, %s elapsed, ETA %s] %s\n", done, total_jobs,
                  duration_text(seconds_since(t_start)).c_str(), left < 0 ? "?" : duration_text(left).c_str(),
                  line.c_str());
      std::fflush(stdout);
    }
  }
  if (failed) {
    for (auto& r : running) {
      kill(r.pid, SIGTERM);
      waitpid(r.pid, nullptr, 0);
      close(r.fd);
    }
    std::fprintf(stderr, "%s", failure.c_str());
    return 1;
  }
  std::printf("all runs finished in %s; writing the report\n", duration_text(seconds_since(t_jobs)).c_str());
  const std::vector<claim_result> verdicts = write_report(out, s, data, seconds_since(t_start));
  print_verdicts(verdicts);
  std::printf("report: %s\n", (out / "report.md").string().c_str());
  return 0;
}

}  // namespace ablation

int main(int argc, char** argv) {
  using namespace ablation;
  try {
    study_settings s;
    fs::path out = "results";
    std::string worker_job;
    bool fresh_base = false, report_only = false;
    std::vector<std::pair<std::string, std::string>> sets;
    std::string mode;  // default: "full" with --device cuda (about 11 minutes on one H100), else "default"
    std::map<std::string, std::string> direct;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--out") out = value();
      else if (a == "--worker") worker_job = value();
      else if (a == "--full") mode = "full";
      else if (a == "--default") mode = "default";
      else if (a == "--smoke") mode = "smoke";
      else if (a == "--device") direct["device"] = value();
      else if (a == "--workers") direct["workers"] = value();
      else if (a == "--threads") direct["threads"] = value();
      else if (a == "--ranks") direct["ranks"] = value();
      else if (a == "--seeds") {
        // --seeds N: N seeds for every configuration (secondary_seeds can be set apart with --set).
        direct["seeds"] = value();
        direct["secondary_seeds"] = direct["seeds"];
      } else if (a == "--bases") direct["bases"] = value();
      else if (a == "--configs") direct["configs"] = value();
      else if (a == "--fresh-base") fresh_base = true;
      else if (a == "--report-only") report_only = true;
      else if (a == "--set") {
        const std::string kv = value();
        const auto eq = kv.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("--set needs key=value");
        sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      } else if (a == "--help" || a == "-h") {
        std::printf(
            "usage: reco_ablation [--out DIR] [--default | --full | --smoke] [--device cpu|cuda] [--workers N]\n"
            "                     [--threads N] [--ranks N] [--bases N] [--seeds N] [--configs a,b,...]\n"
            "                     [--set key=value]...\n"
            "                     [--fresh-base] [--report-only]\n"
            "--report-only: rewrite the report from the runs already in --out (same settings)\n"
            "the study's size: --default on the CPU, --full with --device cuda, unless one is given\n"
            "--ranks N: every training job runs as N data-parallel processes (Gloo, CPU)\n"
            "settings keys: see <out>/settings.txt after a run\n");
        return 0;
      } else {
        throw std::invalid_argument("unknown argument '" + a + "' (see --help)");
      }
    }
    if (!worker_job.empty()) return run_worker(out, worker_job);
    if (mode.empty()) mode = direct.count("device") && direct["device"] == "cuda" ? "full" : "default";
    apply_mode(s, mode);
    for (const auto& [k, v] : direct) s.assign(k, v);
    for (const auto& [k, v] : sets) s.assign(k, v);
    for (const auto& c : s.configs) find_algorithm(c);  // fail early on a typo
    // Every rank needs a non-empty share of every optimiser step, which holds at least one group.
    if (s.ranks < 1 || s.ranks > s.rl.group)
      throw std::invalid_argument("--ranks must be between 1 and rl.group (" + std::to_string(s.rl.group) + ")");
    if (s.ranks > 1 && s.device != "cpu")
      throw std::invalid_argument("--ranks > 1 runs on --device cpu (planned steps take CPU tensors)");
    if (s.ranks > 1 && !ranks_available())
      throw std::invalid_argument("--ranks > 1 needs a build with Gloo's headers (Debian: libgloo-dev)");
    return run_main(s, out, fresh_base, report_only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reco_ablation: %s\n", e.what());
    return 1;
  }
}
