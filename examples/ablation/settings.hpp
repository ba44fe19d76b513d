// Every knob of the study in one struct, written to <out>/settings.txt so that the worker
// processes (and a reader of the results) see exactly what the run used.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "countdown.hpp"
#include "evaluate.hpp"
#include "model.hpp"
#include "pretrain.hpp"
#include "rl.hpp"

namespace ablation {

struct study_settings {
  std::string mode = "default";  // default, full or smoke
  std::string device = "cpu";
  int workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // concurrent workers: all cores
  int threads = 1;               // intra-op threads per worker
  int ranks = 1;                 // data-parallel processes per training job (Gloo, CPU)
  int seeds = 3;                 // RL seeds per base policy of the primary configurations (GRPO, ReCo)
  int secondary_seeds = 1;       // RL seeds per base policy of every other configuration
  int bases = 4;                 // base policies (pretraining seeds pretrain.seed, pretrain.seed + 1, ...)
  std::vector<std::string> configs;  // empty = all ten
  uint64_t data_seed = 20240611;     // test set and RL training pool
  int test_problems = 96;
  std::array<int, 3> test_mix = {1, 1, 2};  // relative shares of common_only / both / rare_only
  int train_problems = 512;  // RL prompt pool, seen several times (the paper: 20 epochs of MATH)
  std::array<double, 3> train_accept = {1.0, 1.0, 1.0};  // class acceptance of the RL pool (all as drawn)
  task_config task;
  model_config model;
  pretrain_config pretrain;
  rl_config rl;
  eval_config eval;

  // Visits every scalar as (name, string value getter, setter) for (de)serialisation.
  template <class F>
  void visit(F&& f) {
    auto num = [&](const std::string& n, auto& v) {
      f(n, [&v] { std::ostringstream o; o.precision(17); o << v; return o.str(); },
        [&v](const std::string& s) { std::istringstream i(s); i >> v; });
    };
    f("mode", [this] { return mode; }, [this](const std::string& s) { mode = s; });
    f("device", [this] { return device; }, [this](const std::string& s) { device = s; });
    f("configs", [this] { return join(configs); }, [this](const std::string& s) { configs = split(s); });
    num("workers", workers);
    num("threads", threads);
    num("ranks", ranks);
    num("seeds", seeds);
    num("secondary_seeds", secondary_seeds);
    num("bases", bases);
    num("data_seed", data_seed);
    num("test_problems", test_problems);
    for (int c = 0; c < 3; ++c) num(std::string("test_mix.") + class_name(problem_class(c)), test_mix[c]);
    num("train_problems", train_problems);
    for (int c = 0; c < 3; ++c) num(std::string("train_accept.") + class_name(problem_class(c)), train_accept[c]);
    num("task.numbers", task.numbers);
    num("task.max_input", task.max_input);
    num("task.max_value", task.max_value);
    num("task.rare_weight", task.rare_weight);
    num("task.swap_weight", task.swap_weight);
    num("model.d_model", model.d_model);
    num("model.layers", model.layers);
    num("model.heads", model.heads);
    num("model.d_ff", model.d_ff);
    num("pretrain.steps", pretrain.steps);
    num("pretrain.batch", pretrain.batch);
    num("pretrain.lr", pretrain.lr);
    num("pretrain.warmup", pretrain.warmup);
    num("pretrain.weight_decay", pretrain.weight_decay);
    for (int c = 0; c < 3; ++c)
      num(std::string("pretrain.accept.") + class_name(problem_class(c)), pretrain.class_accept[c]);
    num("pretrain.seed", pretrain.seed);
    num("rl.steps", rl.steps);
    num("rl.prompts", rl.prompts);
    num("rl.group", rl.group);
    num("rl.minibatches", rl.minibatches);
    num("rl.epochs", rl.epochs);
    num("rl.lr", rl.lr);
    num("rl.weight_decay", rl.weight_decay);
    num("rl.grad_clip", rl.grad_clip);
    num("rl.temperature", rl.temperature);
    num("rl.extra_length", rl.extra_length);
    num("rl.dapo_rounds", rl.dapo_rounds);
    num("eval.samples", eval.samples);
    num("eval.temperature", eval.temperature);
    num("eval.top_p", eval.top_p);
    num("eval.batch_rows", eval.batch_rows);
    num("eval.variance_rollouts", eval.variance_rollouts);
    num("eval.likelihood_samples", eval.likelihood_samples);
    num("eval.diversity_samples", eval.diversity_samples);
  }

  // Derived fields that are not settings of their own.
  void finalise() {
    model.vocab = vocabulary{task.max_value}.size();
    model.max_len = task.prompt_length() + task.response_length() + rl.extra_length;
  }

  std::string serialise() {
    std::string s;
    visit([&s](const std::string& n, auto get, auto) { s += n + "=" + get() + "\n"; });
    return s;
  }

  // "key=value" assignment; throws on an unknown key.
  void assign(const std::string& key, const std::string& value) {
    bool found = false;
    visit([&](const std::string& n, auto, auto set) {
      if (n == key) {
        set(value);
        found = true;
      }
    });
    if (!found) throw std::invalid_argument("unknown setting '" + key + "'");
  }

  void load(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) assign(line.substr(0, eq), line.substr(eq + 1));
    }
    finalise();
  }

  // The settings that determine the base model (its cache key). The version changes whenever
  // the code changes what a given set of settings produces (token layout, demonstrator, model).
  static constexpr int base_model_version = 2;
  std::string base_model_key() {
    std::string s = "v" + std::to_string(base_model_version) + ";";
    visit([&s](const std::string& n, auto get, auto) {
      if (n.rfind("task.", 0) == 0 || n.rfind("model.", 0) == 0 || n.rfind("pretrain.", 0) == 0 || n == "data_seed" ||
          n.rfind("test_", 0) == 0)
        s += n + "=" + get() + ";";
    });
    uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and compilers
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    std::ostringstream o;
    o << std::hex << h;
    return o.str();
  }

  // The primary comparison (GRPO against ReCo) gets `seeds` runs per base policy, the others
  // `secondary_seeds`.
  static bool is_primary(const std::string& config) { return config == "grpo" || config == "reco"; }
  int seeds_of(const std::string& config) const { return is_primary(config) ? seeds : secondary_seeds; }

  std::vector<std::string> config_names() const {
    if (!configs.empty()) return configs;
    std::vector<std::string> all;
    for (const auto& a : algorithms()) all.push_back(a.name);
    return all;
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
    return s;
  }
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
      if (c == ',') {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  }
};

// The held-out test problems (class quotas from test_mix) and the RL training pool, both from
// data_seed; the pool never contains a test problem (nor a permutation of one).
struct study_data {
  std::vector<problem> test;
  std::vector<problem> train;
  std::set<std::string> test_keys;
};

inline study_data make_study_data(const generator& gen, const study_settings& s) {
  study_data d;
  std::mt19937_64 rng(s.data_seed);
  const int mix_total = s.test_mix[0] + s.test_mix[1] + s.test_mix[2];
  std::array<int, 3> quota{};
  int assigned = 0;
  for (int c = 0; c < 3; ++c) {
    quota[c] = s.test_problems * s.test_mix[c] / mix_total;
    assigned += quota[c];
  }
  quota[2] += s.test_problems - assigned;
  std::array<int, 3> have{};
  while (static_cast<int>(d.test.size()) < s.test_problems) {
    problem p = gen.sample(rng);
    const int c = static_cast<int>(p.cls);
    if (have[c] >= quota[c] || d.test_keys.count(p.key())) continue;
    ++have[c];
    d.test_keys.insert(p.key());
    d.test.push_back(p);
  }
  // Test problems grouped by class (stable order) so tables and plots can slice them.
  std::stable_sort(d.test.begin(), d.test.end(),
                   [](const problem& a, const problem& b) { return a.cls < b.cls; });
  std::set<std::string> train_keys;
  while (static_cast<int>(d.train.size()) < s.train_problems) {
    problem p = gen.sample(rng, s.train_accept);
    if (d.test_keys.count(p.key()) || train_keys.count(p.key())) continue;
    train_keys.insert(p.key());
    d.train.push_back(p);
  }
  return d;
}

}  // namespace ablation
