// The RLVR task of the ablation study: Countdown.
//
// A problem gives n numbers (each 1..max_input) and a target; a response is an expression that
// uses every number exactly once and is evaluated from left to right:
//
//   prompt:    7 3 5 2 -> 24 :
//   response:  5 * 3 + 7 + 2          ((5 * 3) + 7) + 2 = 24   uses + and * only
//              7 * 3 + 5 - 2          ((7 * 3) + 5) - 2 = 24   needs -
//              5 - 2 * 7 + 3          ((5 - 2) * 7) + 3 = 24   needs -
//
// Operations + - * /, division only when exact, and no intermediate value below 0 or above
// max_value. The verifier re-evaluates the expression exactly: the reward is 1 when it is well
// formed, uses the given numbers and ends at the target, else 0.
//
// Every token of a response is a decision (which number next, which operation), so a solution's
// likelihood reflects the strategy it follows; docs/ablation.md explains why the study uses
// this compact form rather than written-out intermediate results.
//
// Strategies. The study's notion of a reasoning strategy is which operations a solution uses.
// '+' and '*' are the "common" operations; '-' and '/' are "rare". A problem is classified by the
// solutions it admits:
//   common_only  every solution uses only + and *
//   both         some solutions use only + and *, others need - or /
//   rare_only    every solution uses - or /
// The synthetic demonstrator that produces the pretraining data prefers common operations (each
// rare operation multiplies a solution's weight by rare_weight), so the base policy learns a
// strong preference for them wherever they work.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ablation {

// Token ids: the numbers 0..max_value are their own ids; symbols follow.
struct vocabulary {
  int max_value = 99;
  int plus() const { return max_value + 1; }
  int minus() const { return max_value + 2; }
  int times() const { return max_value + 3; }
  int divide() const { return max_value + 4; }
  int arrow() const { return max_value + 5; }   // "target follows"
  int colon() const { return max_value + 6; }   // end of prompt
  int eos() const { return max_value + 7; }
  int pad() const { return max_value + 8; }
  int size() const { return max_value + 9; }

  bool is_number(int t) const { return t >= 0 && t <= max_value; }
  int op_token(char op) const {
    switch (op) {
      case '+': return plus();
      case '-': return minus();
      case '*': return times();
      default: return divide();
    }
  }
  char op_of(int t) const {
    if (t == plus()) return '+';
    if (t == minus()) return '-';
    if (t == times()) return '*';
    if (t == divide()) return '/';
    return 0;
  }
  // Compact text, e.g. "7*5+3+2" (used for path uniqueness and for printing).
  std::string text(const std::vector<int>& tokens) const {
    std::string s;
    for (int t : tokens) {
      if (t == eos() || t == pad()) break;
      if (is_number(t)) s += std::to_string(t);
      else if (char o = op_of(t)) s += o;
      else if (t == arrow()) s += "->";
      else if (t == colon()) s += ':';
      else s += '?';
    }
    return s;
  }
};

struct step {
  int lhs = 0, rhs = 0, result = 0;
  char op = '+';
};

enum class problem_class : int { common_only = 0, both = 1, rare_only = 2 };
inline const char* class_name(problem_class c) {
  switch (c) {
    case problem_class::common_only: return "common_only";
    case problem_class::both: return "both";
    default: return "rare_only";
  }
}

struct problem {
  std::vector<int> numbers;
  int target = 0;
  problem_class cls = problem_class::common_only;
  // Canonical key (sorted numbers + target): a problem and its permutations share it, which is
  // how held-out problems are kept out of pretraining and RL training.
  std::string key() const {
    std::vector<int> s = numbers;
    std::sort(s.begin(), s.end());
    std::string k;
    for (int v : s) k += std::to_string(v) + ".";
    return k + ">" + std::to_string(target);
  }
};

inline bool is_rare_op(char op) { return op == '-' || op == '/'; }

// Exact integer arithmetic under the task's rules; false when the step is not allowed.
inline bool apply_op(char op, int a, int b, int max_value, int& out) {
  long v;
  switch (op) {
    case '+': v = static_cast<long>(a) + b; break;
    case '-': v = static_cast<long>(a) - b; break;
    case '*': v = static_cast<long>(a) * b; break;
    case '/':
      if (b == 0 || a % b != 0) return false;
      v = a / b;
      break;
    default: return false;
  }
  if (v < 0 || v > max_value) return false;
  out = static_cast<int>(v);
  return true;
}

struct task_config {
  int numbers = 4;        // numbers per problem
  int max_input = 9;      // each number is drawn from 1..max_input
  int max_value = 99;     // largest value a step may produce (and the vocabulary's numbers)
  double rare_weight = 0.12;   // demonstrator: weight factor per rare operation in a solution
  double swap_weight = 0.35;   // demonstrator: weight of starting "small op large" with + or *
  int prompt_length() const { return numbers + 3; }        // numbers, ->, target, :
  int response_length() const { return 2 * numbers; }      // numbers, operations, EOS
};

// Every solution of one problem, as step lists (duplicates from repeated numbers removed).
class solver {
 public:
  explicit solver(const task_config& cfg) : cfg_(cfg) {}

  // All chains over `numbers`, grouped by the value they end at.
  std::map<int, std::vector<std::vector<step>>> all_chains(const std::vector<int>& numbers) const {
    std::map<int, std::vector<std::vector<step>>> out;
    std::set<std::vector<int>> seen;  // de-duplicate by written form
    std::vector<step> path;
    std::vector<bool> used(numbers.size(), false);
    const char ops[4] = {'+', '-', '*', '/'};
    for (std::size_t i = 0; i < numbers.size(); ++i)
      for (std::size_t j = 0; j < numbers.size(); ++j) {
        if (i == j) continue;
        for (char op : ops) {
          int r;
          if (!apply_op(op, numbers[i], numbers[j], cfg_.max_value, r)) continue;
          used[i] = used[j] = true;
          path.push_back({numbers[i], numbers[j], r, op});
          extend(numbers, used, path, 2, out, seen);
          path.pop_back();
          used[i] = used[j] = false;
        }
      }
    return out;
  }

  static problem_class classify(const std::vector<std::vector<step>>& solutions) {
    bool common = false, rare = false;
    for (const auto& s : solutions) (uses_rare(s) ? rare : common) = true;
    if (common && rare) return problem_class::both;
    return common ? problem_class::common_only : problem_class::rare_only;
  }

  static bool uses_rare(const std::vector<step>& s) {
    for (const auto& st : s)
      if (is_rare_op(st.op)) return true;
    return false;
  }

 private:
  void extend(const std::vector<int>& numbers, std::vector<bool>& used, std::vector<step>& path, std::size_t depth,
              std::map<int, std::vector<std::vector<step>>>& out, std::set<std::vector<int>>& seen) const {
    if (depth == numbers.size()) {
      std::vector<int> sig;
      for (const auto& s : path) sig.insert(sig.end(), {s.lhs, int(s.op), s.rhs, s.result});
      if (seen.insert(sig).second) out[path.back().result].push_back(path);
      return;
    }
    const int r = path.back().result;
    const char ops[4] = {'+', '-', '*', '/'};
    for (std::size_t k = 0; k < numbers.size(); ++k) {
      if (used[k]) continue;
      used[k] = true;
      for (char op : ops) {
        int v;
        if (!apply_op(op, r, numbers[k], cfg_.max_value, v)) continue;
        path.push_back({r, numbers[k], v, op});
        extend(numbers, used, path, depth + 1, out, seen);
        path.pop_back();
      }
      used[k] = false;
    }
  }
  task_config cfg_;
};

// Tokens of a problem's prompt and of a solution.
inline std::vector<int> prompt_tokens(const vocabulary& voc, const problem& p) {
  std::vector<int> t(p.numbers.begin(), p.numbers.end());
  t.push_back(voc.arrow());
  t.push_back(p.target);
  t.push_back(voc.colon());
  return t;
}

inline std::vector<int> solution_tokens(const vocabulary& voc, const std::vector<step>& s) {
  std::vector<int> t = {s[0].lhs};
  for (const auto& st : s) t.insert(t.end(), {voc.op_token(st.op), st.rhs});
  t.push_back(voc.eos());
  return t;
}

// What the verifier found in one response.
struct verdict {
  bool correct = false;
  bool well_formed = false;  // the right shape (numbers and operations alternating, then EOS)
  bool uses_rare = false;    // a rare operation appears in the expression
  int length = 0;            // tokens up to and including EOS (the whole response if none)
};

// The exact verifier: parses the response (tokens up to EOS) and evaluates it left to right.
inline verdict verify(const vocabulary& voc, const problem& p, const int* resp, int len) {
  verdict v;
  int n = 0;
  while (n < len && resp[n] != voc.eos() && resp[n] != voc.pad()) ++n;
  const bool has_eos = n < len && resp[n] == voc.eos();
  v.length = has_eos ? n + 1 : n;
  const int count = static_cast<int>(p.numbers.size());
  if (n != 2 * count - 1) return v;
  std::vector<int> pool = p.numbers;  // unused input numbers
  auto take = [&pool](int value) {
    auto it = std::find(pool.begin(), pool.end(), value);
    if (it == pool.end()) return false;
    pool.erase(it);
    return true;
  };
  bool ok = true;
  int value = resp[0];
  for (int i = 0; i < n; ++i) {
    const bool want_number = i % 2 == 0;
    if (want_number ? !voc.is_number(resp[i]) : !voc.op_of(resp[i])) return v;
  }
  if (!take(resp[0])) ok = false;
  for (int i = 1; i < n; i += 2) {
    const char op = voc.op_of(resp[i]);
    if (is_rare_op(op)) v.uses_rare = true;
    if (!take(resp[i + 1])) ok = false;
    if (ok && !apply_op(op, value, resp[i + 1], voc.max_value, value)) ok = false;
  }
  v.well_formed = has_eos;
  v.correct = ok && has_eos && pool.empty() && value == p.target;
  return v;
}

// Problem generator and the synthetic demonstrator. Chains are enumerated once per multiset of
// numbers (the solutions of a permuted prompt are the same) and cached.
class generator {
 public:
  explicit generator(const task_config& cfg) : cfg_(cfg), voc_{cfg.max_value}, solver_(cfg) {}

  const vocabulary& vocab() const { return voc_; }
  const task_config& config() const { return cfg_; }

  using chain_map = std::map<int, std::vector<std::vector<step>>>;

  // A random problem: numbers uniform in 1..max_input, target uniform over the values the
  // numbers can reach (so every problem is solvable). class_accept[c] is the probability of
  // keeping a problem of class c (rejection sampling shapes the mix of classes).
  template <class Rng>
  problem sample(Rng& rng, const std::array<double, 3>& class_accept = {1.0, 1.0, 1.0}) const {
    std::uniform_int_distribution<int> num(1, cfg_.max_input);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    for (;;) {
      problem p;
      for (int i = 0; i < cfg_.numbers; ++i) p.numbers.push_back(num(rng));
      const chain_map& chains = chains_of(p.numbers);
      if (chains.empty()) continue;
      std::uniform_int_distribution<std::size_t> pick(0, chains.size() - 1);
      auto it = chains.begin();
      std::advance(it, static_cast<long>(pick(rng)));
      p.target = it->first;
      p.cls = solver::classify(it->second);
      if (coin(rng) >= class_accept[static_cast<int>(p.cls)]) continue;
      return p;
    }
  }

  const std::vector<std::vector<step>>& solutions(const problem& p) const {
    static const std::vector<std::vector<step>> none;
    const chain_map& chains = chains_of(p.numbers);
    auto it = chains.find(p.target);
    return it == chains.end() ? none : it->second;
  }

  const chain_map& chains_of(const std::vector<int>& numbers) const {
    std::vector<int> key = numbers;
    std::sort(key.begin(), key.end());
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, solver_.all_chains(key)).first;
    return it->second;
  }

  // The demonstrator's weight of a solution: it prefers + and * (the strategy skew) and starts
  // a commutative first step with the larger number (a writing habit, some surface variety).
  double demo_weight(const std::vector<step>& s) const {
    double w = 1.0;
    for (const auto& st : s)
      if (is_rare_op(st.op)) w *= cfg_.rare_weight;
    if ((s[0].op == '+' || s[0].op == '*') && s[0].lhs < s[0].rhs) w *= cfg_.swap_weight;
    return w;
  }

  template <class Rng>
  const std::vector<step>& demonstrate(const std::vector<std::vector<step>>& sols, Rng& rng) const {
    std::vector<double> w;
    w.reserve(sols.size());
    for (const auto& s : sols) w.push_back(demo_weight(s));
    std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
    return sols[pick(rng)];
  }

 private:
  task_config cfg_;
  vocabulary voc_;
  solver solver_;
  mutable std::map<std::vector<int>, chain_map> cache_;
};

}  // namespace ablation
