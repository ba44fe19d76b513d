// reco in one file: a hand-written batch, a ready-made objective (GRPO) and one composed from
// components, each giving its loss and d loss / d logp on the CPU in one call.
//   cmake --build build --target reco_example_basic && build/examples/basic/reco_example_basic
// prints expected_output.txt (checked by the tests, and against an independent reference).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "reco/reco.hpp"

// The loss, its parts, two diagnostics and the gradient, one row per response.
static void print(const char* name, const reco::objective_result& r, const std::vector<double>& grad, int T) {
  std::printf("%s\n  loss %.6f = policy %.6f + kl %.6f\n", name, r.loss, r.policy_loss, r.kl_loss);
  std::printf("  clipped tokens %.4f, mean response weight %.4f\n", r.stats.clip_frac, r.stats.weight_mean);
  std::printf("  d loss / d logp:\n");
  for (std::size_t t = 0; t < grad.size(); ++t)
    std::printf("%s%10.6f%s", t % T == 0 ? "   " : " ", grad[t], (t + 1) % T == 0 ? "\n" : "");
}

int main() {
  // Two prompts, two sampled responses each (group_offsets: responses [0, 2) and [2, 4)),
  // padded to T = 3 tokens; the last response has two tokens (mask 0 marks the padding).
  const int R = 4, T = 3;
  const std::vector<double> logp = {-0.9, -1.2, -0.4, -1.5, -0.3, -2.0, -0.7, -0.6, -1.1, -0.2, -1.8, 0.0};
  const std::vector<double> old_logp = {-1.0, -1.2, -0.7, -1.4, -0.3, -1.6, -0.7, -0.9, -1.0, -0.3, -1.8, 0.0};
  const std::vector<double> ref_logp = {-1.1, -1.0, -0.5, -1.5, -0.4, -1.8, -0.8, -0.6, -1.2, -0.2, -1.5, 0.0};
  const std::vector<std::uint8_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  const std::vector<double> rewards = {1.0, 0.0, 0.2, 1.0};
  const std::vector<reco::index_t> group_offsets = {0, 2, 4};

  reco::batch_view<double> batch;
  batch.layout = reco::padded(R, T);
  batch.group_offsets = group_offsets;
  batch.logp = logp;  // log pi_theta of each sampled token: the loss is differentiated by these
  batch.old_logp = old_logp;
  batch.ref_logp = ref_logp;
  batch.mask = mask;
  batch.rewards = rewards;
  std::vector<double> grad(logp.size());

  // 1. A preset: GRPO with verl's constants (clip 0.2, dual clip 3, k3 KL with beta 0.001).
  reco::presets::grpo grpo;
  print("grpo", grpo(reco::cpu{}, batch, reco::gradients<double>{grad, {}}), grad, T);

  // 2. A composition: ReCo's token ratio and response weight inside a DAPO-style objective
  // (clip-higher, token-mean aggregation), with the same KL term.
  using my_objective = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
                                       reco::expected_count_weight, reco::token_mean, reco::kl_penalty>;
  my_objective mine;
  mine.clip.params.eps_high = 0.28;
  print("my_objective", mine(reco::cpu{}, batch, reco::gradients<double>{grad, {}}), grad, T);
  return 0;
}
