// examples/basic/main.cpp's batch and objectives through the independent reference, printed in
// the example's format: ctest compares this with examples/basic/expected_output.txt, so that the
// expected output the example is checked against is not the library's own say-so.
#include <cstdio>
#include <vector>

#include "reference/reco_ref.hpp"

static void print(const char* name, const reco_ref::output& r, int T) {
  std::printf("%s\n  loss %.6f = policy %.6f + kl %.6f\n", name, r.loss, r.policy_loss, r.kl_loss);
  std::printf("  clipped tokens %.4f, mean response weight %.4f\n", r.clip_frac, r.weight_mean);
  std::printf("  d loss / d logp:\n");
  for (std::size_t t = 0; t < r.grad_logp.size(); ++t)
    std::printf("%s%10.6f%s", t % T == 0 ? "   " : " ", r.grad_logp[t], (t + 1) % T == 0 ? "\n" : "");
}

int main() {
  // The example's batch (keep in step with examples/basic/main.cpp).
  const int R = 4, T = 3;
  reco_ref::batch b;
  for (int i = 0; i < R; ++i) {
    b.token_begin.push_back(i * T);
    b.token_end.push_back((i + 1) * T);
  }
  b.num_tokens = R * T;
  b.max_length = T;
  b.logp = {-0.9, -1.2, -0.4, -1.5, -0.3, -2.0, -0.7, -0.6, -1.1, -0.2, -1.8, 0.0};
  b.old_logp = {-1.0, -1.2, -0.7, -1.4, -0.3, -1.6, -0.7, -0.9, -1.0, -0.3, -1.8, 0.0};
  b.ref_logp = {-1.1, -1.0, -0.5, -1.5, -0.4, -1.8, -0.8, -0.6, -1.2, -0.2, -1.5, 0.0};
  b.mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  b.rewards = {1.0, 0.0, 0.2, 1.0};
  b.group_offsets = {0, 2, 4};

  print("grpo", reco_ref::evaluate(b, reco_ref::preset("grpo")), T);

  // grpo advantage, variance ratio, PPO clip 0.2 / 0.28, expected-count weight (cap 10),
  // token-mean aggregation, k3 KL with beta 0.001.
  reco_ref::config c;
  c.adv = reco_ref::advantage::grpo;
  c.ratio_form = reco_ref::ratio::variance;
  c.clip_mode = reco_ref::clip::ppo;
  c.eps_low = 0.2;
  c.eps_high = 0.28;
  c.weight_mode = reco_ref::weight::expected_count;
  c.weight_cap = 10;
  c.agg = reco_ref::aggregation::token_mean;
  c.kl_mode = reco_ref::kl::k3;
  c.kl_beta = 0.001;
  print("my_objective", reco_ref::evaluate(b, c), T);
  return 0;
}
