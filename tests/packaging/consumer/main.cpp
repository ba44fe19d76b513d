// Computes the ReCo loss on a tiny batch and checks it against a value worked out by hand.
#include <cmath>
#include <cstdio>
#include <vector>

#include "reco/reco.hpp"

int main() {
  // One group of two responses, rewards 1 and 0, on-policy, two tokens each.
  std::vector<double> logp = {-0.5, -1.0, -0.25, -2.0}, rewards = {1.0, 0.0};
  std::vector<reco::index_t> groups = {0, 2};
  reco::batch_view<double> b;
  b.layout = reco::padded(2, 2);
  b.group_offsets = groups;
  b.logp = logp;
  b.ref_logp = logp;  // KL term is 0
  b.rewards = rewards;
  std::vector<double> g(4);
  const reco::objective_result r = reco::presets::reco{}(reco::cpu{}, b, reco::gradients<double>{g, {}});
  // On-policy every ratio is 1: A = +-0.5/(sqrt(0.5) + 1e-6), w_i = 1 / (2 exp(mean logp_i)).
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  const double w0 = 1.0 / (2.0 * std::exp(-0.75)), w1 = 1.0 / (2.0 * std::exp(-1.125));
  const double expected = (-w0 * a + w1 * a) / 2.0;
  if (std::fabs(r.loss - expected) > 1e-12) {
    std::printf("loss %.17g, expected %.17g\n", r.loss, expected);
    return 1;
  }
  std::printf("ok: loss %.6f\n", r.loss);
  return 0;
}
