// Evaluation of one policy on the held-out problems: many samples per problem at temperature
// 0.6 / top-p 0.95 (the paper's evaluation setting) for Pass@k, plus the analyses of the paper's
// figures: token variance by position (rollouts at temperature 1.0), the base-model likelihood
// of correct responses (Figure 1's KDE input) and diversity among correct responses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "reco/eval/bleu.hpp"
#include "reco/eval/kde.hpp"
#include "reco/eval/token_variance.hpp"

#include "countdown.hpp"
#include "model.hpp"
#include "rl.hpp"

namespace ablation {

struct eval_config {
  int samples = 256;           // per problem (Pass@k up to k = samples)
  double temperature = 0.6;
  double top_p = 0.95;
  int64_t batch_rows = 4096;   // responses generated per call
  int variance_rollouts = 8;   // per problem, temperature 1.0, for token variance by position
  int likelihood_samples = 1500;  // correct responses scored by the base model (subsampled)
  int diversity_samples = 16;  // first samples per problem for Self-BLEU among correct ones
};

struct problem_eval {
  int correct = 0;           // correct samples out of eval_config::samples
  int distinct_correct = 0;  // distinct correct responses
  int rare_correct = 0;      // correct samples that use a rare operation (- or /)
};

struct eval_result {
  std::vector<problem_eval> problems;
  reco::eval::position_variance_result token_variance;
  std::vector<double> base_likelihood;  // mean base log-prob per token of sampled correct responses
  std::vector<int> base_likelihood_problem;  // the held-out problem of each (within-problem Figure 1)
  double self_bleu_correct = 0;         // Self-BLEU among correct responses (NaN if undefined)
};

inline eval_result evaluate(transformer& policy, transformer& base, const generator& gen,
                            const std::vector<problem>& test, const eval_config& cfg, uint64_t seed,
                            torch::Device dev) {
  torch::NoGradGuard ng;
  policy->eval();
  base->eval();
  const vocabulary& voc = gen.vocab();
  const int64_t P = gen.config().prompt_length();
  const int L = gen.config().response_length() + 4;
  uniform_stream uniforms(seed * 6151 + 11);
  std::mt19937_64 rng(seed * 31337 + 5);
  sample_settings ss;
  ss.temperature = cfg.temperature;
  ss.top_p = cfg.top_p;
  ss.max_new = L;

  eval_result res;
  res.problems.resize(test.size());
  std::vector<std::set<std::vector<int>>> distinct(test.size());
  std::vector<std::vector<reco::eval::token_ids>> div_resp(test.size());
  std::vector<std::vector<bool>> div_ok(test.size());
  // Correct responses as (problem, tokens); subsampled by reservoir for the likelihood scoring.
  std::vector<std::pair<int, std::vector<int>>> reservoir;
  int64_t seen_correct = 0;

  const int per_call = std::max<int>(1, static_cast<int>(cfg.batch_rows / cfg.samples));
  for (std::size_t p0 = 0; p0 < test.size(); p0 += per_call) {
    const std::size_t p1 = std::min(test.size(), p0 + per_call);
    std::vector<int> which;
    for (std::size_t p = p0; p < p1; ++p) which.push_back(static_cast<int>(p));
    rollout_batch b = sample_groups(policy, gen, test, which, cfg.samples, ss, uniforms, dev);
    auto host = b.tokens.to(torch::kCPU).contiguous();
    const int64_t W = host.size(1);
    for (std::size_t i = 0; i < b.problem_of.size(); ++i) {
      const int p = b.problem_of[i];
      const int64_t* t = host.data_ptr<int64_t>() + static_cast<int64_t>(i) * W;
      std::vector<int> resp(t, t + W);
      const bool ok = b.reward[i] > 0.5f;
      const int sample_index = static_cast<int>(i % static_cast<std::size_t>(cfg.samples));
      if (sample_index < cfg.diversity_samples) {
        reco::eval::token_ids r;
        for (int tok : resp) {
          if (tok == voc.eos() || tok == voc.pad()) break;
          r.push_back(tok);
        }
        div_resp[p].push_back(std::move(r));
        div_ok[p].push_back(ok);
      }
      if (!ok) continue;
      problem_eval& e = res.problems[p];
      ++e.correct;
      e.rare_correct += verify(voc, test[p], resp.data(), static_cast<int>(W)).uses_rare ? 1 : 0;
      distinct[p].insert(resp);
      ++seen_correct;
      if (static_cast<int>(reservoir.size()) < cfg.likelihood_samples) {
        reservoir.emplace_back(p, std::move(resp));
      } else {
        std::uniform_int_distribution<int64_t> pick(0, seen_correct - 1);
        const int64_t j = pick(rng);
        if (j < cfg.likelihood_samples) reservoir[static_cast<std::size_t>(j)] = {p, std::move(resp)};
      }
    }
  }
  for (std::size_t p = 0; p < test.size(); ++p) res.problems[p].distinct_correct = static_cast<int>(distinct[p].size());

  // Self-BLEU among correct responses (prompts with fewer than two correct are skipped).
  bool any = false;
  for (const auto& v : div_ok) any = any || std::count(v.begin(), v.end(), true) >= 2;
  res.self_bleu_correct = any ? reco::eval::self_bleu_among_correct(div_resp, div_ok).mean
                              : std::numeric_limits<double>::quiet_NaN();

  // Base-model likelihood of the sampled correct responses (Figure 1).
  if (!reservoir.empty()) {
    std::vector<std::vector<int>> prompts, responses;
    for (const auto& [p, r] : reservoir) {
      prompts.push_back(prompt_tokens(voc, test[p]));
      responses.push_back(r);
      res.base_likelihood_problem.push_back(p);
    }
    for (std::size_t s = 0; s < prompts.size(); s += static_cast<std::size_t>(cfg.batch_rows)) {
      const std::size_t e = std::min(prompts.size(), s + static_cast<std::size_t>(cfg.batch_rows));
      std::vector<std::vector<int>> pp(prompts.begin() + s, prompts.begin() + e), rr(responses.begin() + s, responses.begin() + e);
      auto rows = pack_rows(pp, rr, L, voc.pad()).to(dev);
      auto tokens = rows.narrow(1, P, L);
      auto mask = tokens != voc.pad();
      auto logp = response_logp(base, rows, tokens, mask, P).first;
      std::vector<double> packed;
      std::vector<reco::index_t> off;
      pack_valid(logp, mask, packed, off);
      auto ll = reco::eval::mean_log_likelihood_per_response(packed, off);
      res.base_likelihood.insert(res.base_likelihood.end(), ll.begin(), ll.end());
    }
  }

  // Token variance p(1 - p) by position: rollouts at temperature 1.0 (p is then the policy's own
  // probability of the sampled token), variance_rollouts per problem.
  {
    sample_settings tv;
    tv.temperature = 1.0;
    tv.top_p = 1.0;
    tv.max_new = L;
    std::vector<int> all(test.size());
    for (std::size_t p = 0; p < test.size(); ++p) all[p] = static_cast<int>(p);
    std::vector<std::vector<int>> prompts;
    for (int p : all)
      for (int j = 0; j < cfg.variance_rollouts; ++j) prompts.push_back(prompt_tokens(voc, test[p]));
    auto prompt_rows = pack_rows(prompts, std::vector<std::vector<int>>(prompts.size()), 0, voc.pad()).to(dev);
    rollout r = generate(policy, prompt_rows, tv, voc.eos(), voc.pad(), uniforms);
    std::vector<double> packed;
    std::vector<reco::index_t> off;
    pack_valid(r.logp, r.mask, packed, off);
    res.token_variance =
        reco::eval::token_variance_by_position(packed, off, reco::eval::probability_input::log_probability);
  }
  return res;
}

}  // namespace ablation
