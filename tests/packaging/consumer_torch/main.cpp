// reco::torch from an installed reco: the ReCo loss and its gradient on a tiny batch of tensors,
// and log-probability + entropy from logits, each checked against values worked out by hand.
#include <cmath>
#include <cstdio>

#include <torch/torch.h>

#include "reco/torch/policy_loss.hpp"
#include "reco/torch/token_logp_entropy.hpp"

static int failures = 0;
static void check(const char* what, double got, double expected) {
  if (std::fabs(got - expected) > 1e-12 * (1.0 + std::fabs(expected))) {
    std::printf("%s: %.17g, expected %.17g\n", what, got, expected);
    ++failures;
  }
}

int main() {
  const auto f64 = torch::dtype(torch::kFloat64);
  // One group of two responses, rewards 1 and 0, on-policy, two tokens each.
  reco::torch::policy_inputs in;
  in.logp = torch::tensor({-0.5, -1.0, -0.25, -2.0}, f64).reshape({2, 2}).requires_grad_();
  in.ref_logp = in.logp.detach();  // KL term is 0
  in.rewards = torch::tensor({1.0, 0.0}, f64);
  in.group_offsets = torch::tensor({0, 2}, torch::kInt64);
  const auto out = reco::torch::policy_loss("reco", in);
  out.loss.backward();
  // On-policy every ratio is 1: A = +-0.5/(sqrt(0.5) + 1e-6), w_i = 1 / (2 exp(mean logp_i)),
  // loss = mean over responses of -w_i A_i. ReCo's token ratio p(1 - sg p)/(p_old(1 - p_old))
  // has d/dlogp equal to its value, 1 here, so d loss / d logp_t = -w_i A_i / (T R) = -w_i A_i / 4.
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  const double w[2] = {1.0 / (2.0 * std::exp(-0.75)), 1.0 / (2.0 * std::exp(-1.125))};
  const double adv[2] = {a, -a};
  check("loss", out.loss.item<double>(), (-w[0] * adv[0] - w[1] * adv[1]) / 2.0);
  const auto grad = in.logp.grad().reshape({4});
  for (int t = 0; t < 4; ++t) check("grad", grad[t].item<double>(), -w[t / 2] * adv[t / 2] / 4.0);

  // Logits [1, 3] = (0, 1, 2), token 2: logp = 2 - log(1 + e + e^2), entropy = -sum p log p.
  const auto logits = torch::tensor({{0.0, 1.0, 2.0}}, f64);
  const auto [logp, entropy] = reco::torch::token_logp_entropy(logits, torch::tensor({2}, torch::kInt64));
  const double lse = std::log(1.0 + std::exp(1.0) + std::exp(2.0));
  double h = 0.0;
  for (double z : {0.0, 1.0, 2.0}) h -= std::exp(z - lse) * (z - lse);
  check("logp", logp[0].item<double>(), 2.0 - lse);
  check("entropy", entropy[0].item<double>(), h);

  if (failures) return 1;
  std::printf("ok: loss %.6f, token logp %.6f, entropy %.6f\n", out.loss.item<double>(), logp[0].item<double>(),
              entropy[0].item<double>());
  return 0;
}
