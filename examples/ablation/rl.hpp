// The RL trainer of the ablation study: G rollouts per prompt, binary verifier reward, each
// rollout batch split into PPO mini-batches (one optimiser step each, all but the first
// off-policy), AdamW, KL to the base policy, and the objective computed by reco through its
// LibTorch adapter.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "reco/backend/cpu.hpp"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/batch_ops/overlong_penalty.hpp"
#include "reco/eval/bleu.hpp"
#include "reco/eval/distinct_n.hpp"
#include "reco/eval/path_uniqueness.hpp"
#include "reco/eval/token_variance.hpp"
#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"
#include "reco/torch/token_logp_entropy.hpp"

#include "countdown.hpp"
#include "model.hpp"
#include "pretrain.hpp"

namespace ablation {

// One configuration of the study = one reco preset (+ DAPO's batch operations where the method
// includes them). Everything else is shared.
struct algorithm {
  std::string name;    // file and CLI name
  std::string label;   // as in the paper's tables
  std::string preset;  // reco::torch::policy_loss preset
  bool dapo_batch_ops; // DAPO dynamic sampling (group filter) + overlong reward shaping
};

inline const std::vector<algorithm>& algorithms() {
  static const std::vector<algorithm> all = {
      {"grpo", "GRPO", "grpo", false},
      {"aspo", "ASPO", "aspo", false},
      {"response_only", "Response only", "reco_response_only", false},
      {"token_only", "Token only", "reco_token_only", false},
      {"reco", "ReCo", "reco", false},
      {"reco_no_cap", "ReCo, no weight cap", "reco_no_cap", false},
      {"dapo", "DAPO", "dapo", true},
      {"dapo_reco", "DAPO + ReCo", "dapo_reco", true},
      {"rule_80_20", "80/20 Rule", "rule_80_20", true},
      {"rule_80_20_reco", "80/20 Rule + ReCo", "rule_80_20_reco", true},
  };
  return all;
}

inline const algorithm& find_algorithm(const std::string& name) {
  for (const auto& a : algorithms())
    if (a.name == name) return a;
  throw std::invalid_argument("unknown configuration '" + name + "'");
}

struct rl_config {
  int steps = 60;
  int prompts = 32;        // prompts per rollout batch
  int group = 8;           // G rollouts per prompt
  int minibatches = 4;     // PPO mini-batches per rollout batch (= optimiser steps)
  int epochs = 2;          // PPO epochs: passes over the rollout batch, each in `minibatches` steps
  double lr = 2e-5;        // chosen on GRPO and the base only (docs/ablation.md, design log)
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  double temperature = 1.0;  // rollouts: temperature 1.0, top-p 1.0 (the paper's setting)
  int extra_length = 4;      // rollouts may run this many tokens past a well-formed answer
  int dapo_rounds = 3;       // DAPO dynamic sampling: at most this many generation rounds per step
};

struct step_metrics {
  int step = 0;
  double reward = 0;           // mean binary reward of the step's rollouts
  double entropy = 0;          // mean token entropy (rollout policy, valid tokens)
  double abs_kl = 0;           // mean |logp - ref_logp| (k1) over valid tokens
  double distinct2 = 0;        // Distinct-2, pooled per prompt
  double self_bleu = 0;        // Self-BLEU-4 within each prompt's group, mean over prompts
  double path_uniqueness = 0;  // distinct first steps / G, mean over prompts
  double loss = 0;             // mean objective value over the mini-batches
  double clip_frac = 0;
  double ppo_kl = 0;
  double weight_mean = 0, weight_max = 0;
  double cap_hits = 0;         // responses whose ReCo weight hit the cap (sum over mini-batches)
  double groups_used = 0;      // groups trained on (DAPO: after the filter)
  double seconds = 0;
  // The mechanism, on the step's trained rollouts whatever the configuration: w = min(10,
  // 1/(G pbar_old)) is ReCo's expected-count weight, A the GRPO advantage of the (shaped) rewards.
  double weight_spread = NaN;      // median over groups with >= 2 correct: max w / min w among the correct
  double rare_pos_uniform = NaN;   // share of the positive mass sum(A) over A > 0 on rare-strategy responses
  double rare_pos_weighted = NaN;  // the same for sum(w A)
  double rare_neg_uniform = NaN;   // share of the negative mass sum(|A|) over A < 0 on responses using - or /
  double rare_neg_weighted = NaN;  // the same for sum(w |A|)
  double neg_pos_weighted = NaN;   // sum(w |A|) over A < 0 / sum(w A) over A > 0 (uniform weights: 1)
  double ratio_gap = 0;            // mean |v - r| over the updates' policy tokens: variance vs standard ratio
  static constexpr double NaN = std::numeric_limits<double>::quiet_NaN();
};

// Host-side view of a rollout batch.
struct rollout_batch {
  torch::Tensor rows;    // [R, P + L] prompt + response
  torch::Tensor tokens;  // [R, L]
  torch::Tensor mask;    // [R, L] bool
  torch::Tensor logp;    // [R, L] log-probability of each token under the policy that sampled it
  torch::Tensor entropy; // [R, L] entropy of that policy at each position
  std::vector<int> problem_of;      // per response: index into the problem list
  std::vector<float> reward;        // binary
  std::vector<bool> rare;           // the response uses - or / (as far as it parses)
  std::vector<float> shaped;        // what the objective reads (DAPO adds the overlong penalty)
  std::vector<reco::index_t> length;
  int groups = 0;
};

// Samples `group` responses for each listed problem.
inline rollout_batch sample_groups(transformer& policy, const generator& gen, const std::vector<problem>& problems,
                                   const std::vector<int>& which, int group, const sample_settings& ss,
                                   uniform_stream& uniforms, torch::Device dev) {
  const vocabulary& voc = gen.vocab();
  std::vector<std::vector<int>> prompts;
  rollout_batch b;
  for (int p : which)
    for (int j = 0; j < group; ++j) {
      prompts.push_back(prompt_tokens(voc, problems[p]));
      b.problem_of.push_back(p);
    }
  auto prompt_rows = pack_rows(prompts, std::vector<std::vector<int>>(prompts.size()), 0, voc.pad()).to(dev);
  rollout r = generate(policy, prompt_rows, ss, voc.eos(), voc.pad(), uniforms);
  b.tokens = r.tokens;
  b.mask = r.mask;
  b.logp = r.logp;
  b.entropy = r.entropy;
  b.rows = torch::cat({prompt_rows, r.tokens}, 1);
  b.groups = static_cast<int>(which.size());
  auto host = r.tokens.to(torch::kCPU).contiguous();
  const int64_t R = host.size(0), L = host.size(1);
  std::vector<int> resp(static_cast<std::size_t>(L));
  for (int64_t i = 0; i < R; ++i) {
    const int64_t* t = host.data_ptr<int64_t>() + i * L;
    for (int64_t j = 0; j < L; ++j) resp[j] = static_cast<int>(t[j]);
    verdict v = verify(voc, problems[b.problem_of[i]], resp.data(), static_cast<int>(L));
    b.reward.push_back(v.correct ? 1.0f : 0.0f);
    b.rare.push_back(v.uses_rare);
    b.length.push_back(v.length);
  }
  b.shaped = b.reward;
  return b;
}

// Keeps the listed groups (all have `group` responses).
inline rollout_batch select_groups(const rollout_batch& b, const std::vector<int>& groups, int group) {
  rollout_batch out;
  std::vector<int64_t> idx;
  for (int g : groups)
    for (int j = 0; j < group; ++j) idx.push_back(static_cast<int64_t>(g) * group + j);
  auto index = torch::tensor(idx, torch::kLong).to(b.rows.device());
  out.rows = b.rows.index_select(0, index);
  out.tokens = b.tokens.index_select(0, index);
  out.mask = b.mask.index_select(0, index);
  out.logp = b.logp.index_select(0, index);
  out.entropy = b.entropy.index_select(0, index);
  for (int64_t i : idx) {
    out.problem_of.push_back(b.problem_of[i]);
    out.reward.push_back(b.reward[i]);
    out.rare.push_back(b.rare[i]);
    out.shaped.push_back(b.shaped[i]);
    out.length.push_back(b.length[i]);
  }
  out.groups = static_cast<int>(groups.size());
  return out;
}

inline rollout_batch concat_batches(const rollout_batch& a, const rollout_batch& b) {
  if (a.groups == 0) return b;
  if (b.groups == 0) return a;
  rollout_batch out = a;
  out.rows = torch::cat({a.rows, b.rows}, 0);
  out.tokens = torch::cat({a.tokens, b.tokens}, 0);
  out.mask = torch::cat({a.mask, b.mask}, 0);
  out.logp = torch::cat({a.logp, b.logp}, 0);
  out.entropy = torch::cat({a.entropy, b.entropy}, 0);
  out.problem_of.insert(out.problem_of.end(), b.problem_of.begin(), b.problem_of.end());
  out.reward.insert(out.reward.end(), b.reward.begin(), b.reward.end());
  out.rare.insert(out.rare.end(), b.rare.begin(), b.rare.end());
  out.shaped.insert(out.shaped.end(), b.shaped.begin(), b.shaped.end());
  out.length.insert(out.length.end(), b.length.begin(), b.length.end());
  out.groups = a.groups + b.groups;
  return out;
}

// DAPO's batch operations through reco::batch_ops: the overlong penalty is added to the rewards,
// then groups whose (shaped) rewards are all equal are dropped. Returns the kept group indices.
inline std::vector<int> dapo_filter(rollout_batch& b, int group, int max_length, int buffer) {
  reco::overlong_params op;
  op.max_length = max_length;
  op.buffer = buffer;
  op.factor = 1.0;
  reco::add_overlong_penalty(reco::cpu{}, reco::span<const reco::index_t>(b.length), op,
                             reco::span<float>(b.shaped));
  std::vector<reco::index_t> offsets(static_cast<std::size_t>(b.groups) + 1);
  for (int g = 0; g <= b.groups; ++g) offsets[g] = static_cast<reco::index_t>(g) * group;
  std::vector<reco::index_t> kept(b.shaped.size()), kept_offsets(offsets.size());
  reco::workspace<reco::cpu> ws;
  reco::group_filter_counts c = reco::filter_groups(
      reco::cpu{}, reco::span<const float>(b.shaped), reco::span<const reco::index_t>(offsets),
      reco::group_filter_params{}, reco::span<reco::index_t>(kept), reco::span<reco::index_t>(kept_offsets), ws);
  std::vector<int> groups;
  for (reco::index_t g = 0; g < c.groups; ++g) groups.push_back(static_cast<int>(kept[kept_offsets[g]] / group));
  return groups;
}

// Log-probabilities (and entropies) of the response tokens under `model`: [R, L] each.
// `temperature` is the sampling temperature the tokens were drawn at.
inline std::pair<torch::Tensor, torch::Tensor> response_logp(transformer& model, const torch::Tensor& rows,
                                                             const torch::Tensor& tokens, const torch::Tensor& mask,
                                                             int64_t P, double temperature = 1.0) {
  auto logits = response_logits(model, rows, P);
  auto [logp, entropy] = reco::torch::token_logp_entropy(logits, tokens, temperature, mask);
  return {logp, entropy};
}

// THE policy-loss call of the trainer: reco's preset through the LibTorch adapter.
inline reco::torch::policy_output policy_loss(const algorithm& algo, const torch::Tensor& logp,
                                              const torch::Tensor& old_logp, const torch::Tensor& ref_logp,
                                              const torch::Tensor& entropy, const torch::Tensor& mask,
                                              const torch::Tensor& rewards, const torch::Tensor& group_offsets) {
  reco::torch::policy_inputs in;
  in.logp = logp;
  in.old_logp = old_logp;
  in.ref_logp = ref_logp;
  in.entropy = entropy;
  in.mask = mask;
  in.rewards = rewards;
  in.group_offsets = group_offsets;
  return reco::torch::policy_loss(algo.preset, in);
}

// The mechanism ReCo acts through, measured on a step's trained rollouts (step_metrics): how far
// its expected-count weights spread among a group's correct responses and where they move the
// advantage mass. The weight and the advantage are recomputed here from their definitions (this
// is a diagnostic, not the objective): w = min(cap, 1 / (G pbar_old)), pbar_old = exp(mean old
// logp); A = (r - mean) / (std + 1e-6) with the unbiased std of the group's shaped rewards.
inline void log_mechanism(const rollout_batch& b, int group, step_metrics& m, double cap = 10.0) {
  const int64_t R = static_cast<int64_t>(b.reward.size());
  if (R == 0) return;
  auto lp = (b.logp * b.mask).sum(1).to(torch::kCPU).to(torch::kDouble).contiguous();
  auto len = b.mask.sum(1).to(torch::kCPU).to(torch::kDouble).contiguous();
  std::vector<double> w(static_cast<std::size_t>(R)), adv(static_cast<std::size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    const double n = len.data_ptr<double>()[i];
    w[i] = n > 0 ? std::min(cap, std::exp(-std::log(static_cast<double>(group)) - lp.data_ptr<double>()[i] / n)) : 0.0;
  }
  std::vector<double> spreads;
  for (int64_t g0 = 0; g0 < R; g0 += group) {
    double mean = 0, ss = 0, lo = INFINITY, hi = 0;
    int correct = 0;
    for (int j = 0; j < group; ++j) mean += b.shaped[g0 + j];
    mean /= group;
    for (int j = 0; j < group; ++j) ss += (b.shaped[g0 + j] - mean) * (b.shaped[g0 + j] - mean);
    const double sd = group > 1 ? std::sqrt(ss / (group - 1)) : 0.0;
    for (int j = 0; j < group; ++j) {
      const int64_t i = g0 + j;
      adv[i] = group > 1 ? (b.shaped[i] - mean) / (sd + 1e-6) : 0.0;
      if (b.reward[i] > 0.5f) {
        ++correct;
        lo = std::min(lo, w[i]);
        hi = std::max(hi, w[i]);
      }
    }
    if (correct >= 2 && lo > 0) spreads.push_back(hi / lo);
  }
  if (!spreads.empty()) {
    std::nth_element(spreads.begin(), spreads.begin() + spreads.size() / 2, spreads.end());
    m.weight_spread = spreads[spreads.size() / 2];
  }
  double pos[2] = {0, 0}, pos_rare[2] = {0, 0}, neg[2] = {0, 0}, neg_rare[2] = {0, 0};
  for (int64_t i = 0; i < R; ++i)
    for (int u = 0; u < 2; ++u) {
      const double mass = (u == 0 ? 1.0 : w[i]) * adv[i];
      if (mass > 0) {
        pos[u] += mass;
        if (b.rare[i]) pos_rare[u] += mass;
      } else if (mass < 0) {
        neg[u] -= mass;
        if (b.rare[i]) neg_rare[u] -= mass;
      }
    }
  if (pos[0] > 0) m.rare_pos_uniform = pos_rare[0] / pos[0];
  if (pos[1] > 0) m.rare_pos_weighted = pos_rare[1] / pos[1];
  if (neg[0] > 0) m.rare_neg_uniform = neg_rare[0] / neg[0];
  if (neg[1] > 0) m.rare_neg_weighted = neg_rare[1] / neg[1];
  if (pos[1] > 0) m.neg_pos_weighted = neg[1] / pos[1];
}

// Sum over valid tokens of |v - r|, the variance ratio p(1-p) / (p_old(1-p_old)) against the
// standard ratio p / p_old (floors 1e-12 as the objective's), and the number of tokens.
inline std::pair<double, double> ratio_gap_sum(const torch::Tensor& logp, const torch::Tensor& old_logp,
                                               const torch::Tensor& mask) {
  torch::NoGradGuard ng;
  auto lp = logp.detach().to(torch::kDouble), olp = old_logp.to(torch::kDouble);
  auto p = lp.exp(), po = olp.exp();
  auto r = (lp - olp).exp();
  auto v = (p * (1 - p)).clamp_min(1e-12) / (po * (1 - po)).clamp_min(1e-12);
  auto m = mask.to(torch::kDouble);
  return {((v - r).abs() * m).sum().item<double>(), m.sum().item<double>()};
}

// What one optimiser step's objective reports (with several ranks: the whole step's values).
struct update_report {
  double loss = 0, clip_frac = 0, ppo_kl = 0, weight_mean = 0, weight_max = 0, cap_hits = 0;
  double ratio_gap = 0, ratio_gap_tokens = 0;  // sum of |v - r| over the policy tokens, and their number
};

inline update_report report_of(const reco::torch::policy_output& out) {
  const auto& s = out.stats.stats;
  return {out.loss.item<double>(), s.clip_frac, s.ppo_kl, s.weight_mean, s.weight_max,
          static_cast<double>(s.weight_cap_hits)};
}

// This rank's share of one optimiser step under data parallelism: the step plan over the process
// group (the step's advantages, weights, normalisers and 80/20 cut), then this rank's planned
// loss. The plan multiplies the loss by the world size W, so that averaging the ranks' gradients
// (average_gradients) gives the step's gradient. `report` receives the step's values: the loss is
// the average of the ranks' planned losses, the token and response means are recombined from the
// ranks' counts.
inline torch::Tensor planned_share_loss(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const algorithm& algo,
                                        std::uint64_t step_id, reco::torch::policy_inputs in, update_report& report) {
  reco::torch::policy_inputs planning = in;
  planning.logp = in.logp.detach();  // the plan reads values only
  reco::torch::step_options options;
  options.step = step_id;  // the same on every rank
  const reco::torch::planned_step plan = reco::torch::build_step_plan(group, algo.preset, {planning}, {}, options);
  reco::torch::policy_output out = reco::torch::policy_loss(algo.preset, in, {}, plan, 0);
  const auto& s = out.stats.stats;
  const double tokens = static_cast<double>(s.policy_tokens), responses = static_cast<double>(s.nonempty_responses);
  const auto gap = ratio_gap_sum(in.logp, in.old_logp, in.mask);
  auto sums = torch::tensor({out.loss.item<double>(), s.clip_frac * tokens, s.ppo_kl * tokens, tokens,
                             s.weight_mean * responses, responses, static_cast<double>(s.weight_cap_hits),
                             gap.first, gap.second},
                            torch::kDouble);
  auto most = torch::tensor({s.weight_max}, torch::kDouble);
  std::vector<torch::Tensor> a{sums}, b{most};
  group->allreduce(a)->wait();
  c10d::AllreduceOptions max_op;
  max_op.reduceOp = c10d::ReduceOp::MAX;
  group->allreduce(b, max_op)->wait();
  const double* v = sums.data_ptr<double>();
  report.loss = v[0] / group->getSize();
  report.clip_frac = v[3] > 0 ? v[1] / v[3] : 0.0;
  report.ppo_kl = v[3] > 0 ? v[2] / v[3] : 0.0;
  report.weight_mean = v[5] > 0 ? v[4] / v[5] : 0.0;
  report.weight_max = most.item<double>();
  report.cap_hits = v[6];
  report.ratio_gap = v[7];
  report.ratio_gap_tokens = v[8];
  return out.loss;
}

// What DDP does after backward: the gradients summed over the ranks, divided by W (one
// all-reduce of all parameters' gradients, flattened). Every rank ends with the same gradient.
inline void average_gradients(transformer& policy, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  std::vector<torch::Tensor> grads;
  for (auto& p : policy->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad().reshape({-1}));
  }
  std::vector<torch::Tensor> flat{torch::cat(grads)};
  group->allreduce(flat)->wait();
  flat[0].div_(group->getSize());
  int64_t at = 0;
  for (auto& p : policy->parameters()) {
    const int64_t n = p.grad().numel();
    p.mutable_grad().copy_(flat[0].narrow(0, at, n).view_as(p.grad()));
    at += n;
  }
}

// Per-prompt diversity of a rollout batch (groups of `group` consecutive responses).
struct diversity {
  double distinct2 = 0, self_bleu = 0, path_uniqueness = 0;
};

inline diversity batch_diversity(const vocabulary& voc, const torch::Tensor& tokens, int group) {
  auto host = tokens.to(torch::kCPU).contiguous();
  const int64_t R = host.size(0), L = host.size(1);
  std::vector<std::vector<reco::eval::token_ids>> ids(static_cast<std::size_t>(R / group));
  std::vector<std::vector<std::string>> first_steps(ids.size());
  std::vector<int> resp(static_cast<std::size_t>(L));
  for (int64_t i = 0; i < R; ++i) {
    const int64_t* t = host.data_ptr<int64_t>() + i * L;
    reco::eval::token_ids r;
    for (int64_t j = 0; j < L && t[j] != voc.eos() && t[j] != voc.pad(); ++j) r.push_back(t[j]);
    // The reasoning path's opening: the first operation as written ("7*5").
    for (int64_t j = 0; j < L; ++j) resp[j] = j < 3 ? static_cast<int>(t[j]) : voc.eos();
    first_steps[i / group].push_back(voc.text(resp));
    ids[i / group].push_back(std::move(r));
  }
  diversity d;
  d.distinct2 = reco::eval::distinct_n(ids, 2);
  double sb = 0;
  for (const auto& g : ids) sb += reco::eval::self_bleu(g);
  d.self_bleu = sb / static_cast<double>(ids.size());
  d.path_uniqueness = reco::eval::path_uniqueness(first_steps);
  return d;
}

// Valid-token values of an [R, L] tensor, packed, with R + 1 offsets (for reco::eval).
inline void pack_valid(const torch::Tensor& values, const torch::Tensor& mask, std::vector<double>& out,
                       std::vector<reco::index_t>& offsets) {
  auto v = values.to(torch::kCPU).to(torch::kDouble).contiguous();
  auto m = mask.to(torch::kCPU).contiguous();
  const int64_t R = v.size(0), L = v.size(1);
  out.clear();
  offsets.assign(1, 0);
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t j = 0; j < L; ++j)
      if (m.data_ptr<bool>()[i * L + j]) out.push_back(v.data_ptr<double>()[i * L + j]);
    offsets.push_back(static_cast<reco::index_t>(out.size()));
  }
}

using step_callback = std::function<void(const step_metrics&)>;

// Trains `policy` (initialised from the base) for cfg.steps rollout batches. With a process
// group (--ranks), every rank samples the same rollouts (same seeds, same parameters) and takes a
// contiguous share of each optimiser step's responses for the loss; the gradients are averaged
// over the ranks, so that every rank takes the same optimiser step as one process would.
inline std::vector<step_metrics> train_rl(transformer& policy, transformer& base, const generator& gen,
                                          const std::vector<problem>& pool, const algorithm& algo,
                                          const rl_config& cfg, uint64_t seed, torch::Device dev,
                                          const step_callback& on_step,
                                          const c10::intrusive_ptr<c10d::ProcessGroup>& group = {}) {
  const vocabulary& voc = gen.vocab();
  const int64_t P = gen.config().prompt_length();
  const int answer_length = gen.config().response_length();
  sample_settings ss;
  ss.temperature = cfg.temperature;
  ss.top_p = 1.0;
  ss.max_new = answer_length + cfg.extra_length;
  uniform_stream uniforms(seed * 7919 + 17);
  std::mt19937_64 rng(seed * 104729 + 3);
  torch::optim::AdamW opt(policy->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  base->eval();
  // Prompts are drawn without replacement from the shuffled pool, epoch after epoch.
  std::vector<int> order(pool.size());
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

  std::vector<step_metrics> history;
  for (int step = 1; step <= cfg.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    step_metrics m;
    m.step = step;
    policy->eval();
    rollout_batch batch = sample_groups(policy, gen, pool, next_prompts(cfg.prompts), cfg.group, ss, uniforms, dev);
    const rollout_batch first = batch;  // the step's rollouts as sampled (for the metrics)
    if (algo.dapo_batch_ops) {
      // Dynamic sampling: keep groups with a reward spread, top up with fresh prompts.
      rollout_batch kept = select_groups(batch, dapo_filter(batch, cfg.group, ss.max_new, cfg.extra_length), cfg.group);
      for (int round = 1; round < cfg.dapo_rounds && kept.groups < cfg.prompts; ++round) {
        rollout_batch more =
            sample_groups(policy, gen, pool, next_prompts(cfg.prompts), cfg.group, ss, uniforms, dev);
        rollout_batch more_kept =
            select_groups(more, dapo_filter(more, cfg.group, ss.max_new, cfg.extra_length), cfg.group);
        std::vector<int> take;
        for (int g = 0; g < more_kept.groups && kept.groups + static_cast<int>(take.size()) < cfg.prompts; ++g)
          take.push_back(g);
        kept = concat_batches(kept, select_groups(more_kept, take, cfg.group));
      }
      batch = kept;
    }
    m.groups_used = batch.groups;

    // The rollout policy's log-probabilities and entropies come from sampling (temperature 1,
    // top-p 1: the policy itself), so old_logp needs no second forward pass; the reference
    // log-probabilities come from the base policy.
    torch::Tensor ref_logp;
    {
      torch::NoGradGuard ng;
      std::vector<double> a, b;
      std::vector<reco::index_t> off;
      pack_valid(first.entropy, first.mask, a, off);
      m.entropy = reco::eval::mean_token_entropy(a, off).token_mean;
      if (batch.groups > 0) {
        ref_logp = response_logp(base, batch.rows, batch.tokens, batch.mask, P, cfg.temperature).first;
        // |KL| on the trained batch (the step's rollouts unless DAPO's filter dropped groups).
        pack_valid(batch.logp, batch.mask, a, off);
        pack_valid(ref_logp, batch.mask, b, off);
        m.abs_kl = reco::eval::mean_abs_kl(a, b, off).token_mean;
      }
    }
    m.reward = std::accumulate(first.reward.begin(), first.reward.end(), 0.0) / first.reward.size();
    diversity d = batch_diversity(voc, first.tokens, cfg.group);
    m.distinct2 = d.distinct2;
    m.self_bleu = d.self_bleu;
    m.path_uniqueness = d.path_uniqueness;

    // PPO mini-batches: whole groups, in order; every optimiser step after the first is off-policy.
    policy->train();
    const int mbs = std::min(cfg.minibatches, std::max(batch.groups, 1));
    int updates = 0;
    double gap_sum = 0, gap_tokens = 0;
    log_mechanism(batch, cfg.group, m);
    for (int epoch = 0; epoch < cfg.epochs; ++epoch)
    for (int k = 0; k < mbs && batch.groups > 0; ++k) {
      const int g0 = batch.groups * k / mbs, g1 = batch.groups * (k + 1) / mbs;
      if (g1 == g0) continue;
      const int64_t r0 = static_cast<int64_t>(g0) * cfg.group, rn = static_cast<int64_t>(g1 - g0) * cfg.group;
      torch::Tensor loss_tensor;
      update_report u;
      if (!group) {
        auto rows = batch.rows.narrow(0, r0, rn), tokens = batch.tokens.narrow(0, r0, rn);
        auto mask = batch.mask.narrow(0, r0, rn);
        auto rewards = torch::from_blob(batch.shaped.data() + r0, {rn}, torch::kFloat).clone().to(dev);
        auto offsets = torch::arange(0, rn + 1, cfg.group, torch::kLong).to(dev);
        auto [logp, entropy] = response_logp(policy, rows, tokens, mask, P, cfg.temperature);
        auto out = policy_loss(algo, logp, batch.logp.narrow(0, r0, rn), ref_logp.narrow(0, r0, rn), entropy, mask,
                               rewards, offsets);
        u = report_of(out);
        std::tie(u.ratio_gap, u.ratio_gap_tokens) = ratio_gap_sum(logp, batch.logp.narrow(0, r0, rn), mask);
        loss_tensor = out.loss;
      } else {
        // This rank's responses [s0, s0 + n) of the optimiser step: contiguous, uneven when W
        // does not divide rn, and a prompt's group may continue on the next rank (prompt ids).
        const int W = group->getSize(), rank = group->getRank();
        const int64_t a = rn * rank / W, n = rn * (rank + 1) / W - a, s0 = r0 + a;
        auto mask = batch.mask.narrow(0, s0, n);
        auto [logp, entropy] = response_logp(policy, batch.rows.narrow(0, s0, n), batch.tokens.narrow(0, s0, n),
                                             mask, P, cfg.temperature);
        std::vector<int64_t> ids;
        for (int64_t i = s0; i < s0 + n; ++i) ids.push_back(i / cfg.group);
        reco::torch::policy_inputs in;
        in.logp = logp;
        in.old_logp = batch.logp.narrow(0, s0, n);
        in.ref_logp = ref_logp.narrow(0, s0, n);
        in.entropy = entropy;
        in.mask = mask;
        in.rewards = torch::from_blob(batch.shaped.data() + s0, {n}, torch::kFloat).clone();
        in.prompt_ids = torch::tensor(ids, torch::kLong);
        const std::uint64_t step_id =
            (static_cast<std::uint64_t>(step - 1) * static_cast<std::uint64_t>(cfg.epochs) + epoch) *
                static_cast<std::uint64_t>(mbs) + static_cast<std::uint64_t>(k) + 1;
        loss_tensor = planned_share_loss(group, algo, step_id, in, u);
      }
      // With ranks, u.loss is the step's (the same on every rank): all ranks stop together.
      if (!std::isfinite(u.loss))
        throw std::runtime_error(algo.name + ": non-finite loss at step " + std::to_string(step));
      opt.zero_grad();
      loss_tensor.backward();
      if (group) average_gradients(policy, group);
      torch::nn::utils::clip_grad_norm_(policy->parameters(), cfg.grad_clip);
      opt.step();
      m.loss += u.loss;
      m.clip_frac += u.clip_frac;
      m.ppo_kl += u.ppo_kl;
      m.weight_mean += u.weight_mean;
      m.weight_max = std::max(m.weight_max, u.weight_max);
      m.cap_hits += u.cap_hits;
      gap_sum += u.ratio_gap;
      gap_tokens += u.ratio_gap_tokens;
      ++updates;
    }
    m.ratio_gap = gap_tokens > 0 ? gap_sum / gap_tokens : 0.0;
    if (updates > 0) {
      m.loss /= updates;
      m.clip_frac /= updates;
      m.ppo_kl /= updates;
      m.weight_mean /= updates;
    }
    policy->eval();
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    history.push_back(m);
    if (on_step) on_step(m);
  }
  return history;
}

}  // namespace ablation
