// Pretraining of the base policy on the demonstrator's solutions (next-token cross-entropy on
// response tokens), cached on disk.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "countdown.hpp"
#include "model.hpp"

namespace ablation {

struct pretrain_config {
  int steps = 1500;
  int batch = 128;
  double lr = 2e-3;
  int warmup = 50;
  double weight_decay = 0.01;
  std::array<double, 3> class_accept = {1.0, 1.0, 0.15};  // mix of problem classes in the corpus
  uint64_t seed = 1234;
};

// [B, P + L] token rows: prompt, response, PAD up to the fixed response length L.
inline torch::Tensor pack_rows(const std::vector<std::vector<int>>& prompts,
                               const std::vector<std::vector<int>>& responses, int L, int pad) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t P = static_cast<int64_t>(prompts[0].size());
  auto rows = torch::full({B, P + L}, pad, torch::kLong);
  auto a = rows.accessor<int64_t, 2>();
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t j = 0; j < P; ++j) a[i][j] = prompts[i][j];
    for (std::size_t j = 0; j < responses[i].size() && static_cast<int64_t>(j) < L; ++j) a[i][P + j] = responses[i][j];
  }
  return rows;
}

// Logits that predict the L response tokens of rows [B, P + L]: [B, L, V].
inline torch::Tensor response_logits(transformer& model, const torch::Tensor& rows, int64_t P) {
  const int64_t L = rows.size(1) - P;
  auto logits = model->forward(rows.narrow(1, 0, P + L - 1));
  return logits.narrow(1, P - 1, L);
}

// A learning-rate schedule: linear warm-up, then cosine decay to 10% of the peak.
inline double warmup_cosine(int step, int total, int warmup, double peak) {
  if (step < warmup) return peak * (step + 1) / warmup;
  const double t = static_cast<double>(step - warmup) / std::max(1, total - warmup);
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.14159265358979 * t)));
}

inline void set_lr(torch::optim::AdamW& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

// Trains `model` from its initialisation. `held_out` holds problem keys that must never appear in
// the corpus. `progress(step, loss)` is called every few steps.
inline void pretrain(transformer& model, const generator& gen, const pretrain_config& cfg,
                     const std::set<std::string>& held_out, torch::Device device,
                     const std::function<void(int, double)>& progress) {
  const vocabulary& voc = gen.vocab();
  const int P = gen.config().prompt_length(), L = gen.config().response_length();
  std::mt19937_64 rng(cfg.seed);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  model->train();
  for (int s = 0; s < cfg.steps; ++s) {
    std::vector<std::vector<int>> prompts, responses;
    while (static_cast<int>(prompts.size()) < cfg.batch) {
      problem p = gen.sample(rng, cfg.class_accept);
      if (held_out.count(p.key())) continue;
      prompts.push_back(prompt_tokens(voc, p));
      responses.push_back(solution_tokens(voc, gen.demonstrate(gen.solutions(p), rng)));
    }
    auto rows = pack_rows(prompts, responses, L, voc.pad()).to(device);
    auto targets = rows.narrow(1, P, L);
    auto logits = response_logits(model, rows, P);
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(voc.pad()));
    set_lr(opt, warmup_cosine(s, cfg.steps, cfg.warmup, cfg.lr));
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    if (progress && (s % 50 == 0 || s + 1 == cfg.steps)) progress(s + 1, loss.item<double>());
  }
  model->eval();
}

// Saves / loads parameters (the module's state as one archive). Writes through a temporary file
// so that an interrupted run never leaves a truncated cache behind.
inline void save_model(transformer& model, const std::string& path) {
  const std::string tmp = path + ".tmp";
  torch::serialize::OutputArchive ar;
  model->save(ar);
  ar.save_to(tmp);
  std::filesystem::rename(tmp, path);
}

inline void load_model(transformer& model, const std::string& path, torch::Device device) {
  torch::serialize::InputArchive ar;
  ar.load_from(path, device);
  model->load(ar);
}

}  // namespace ablation
