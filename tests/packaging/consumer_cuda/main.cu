// The ReCo loss on the CUDA backend for a tiny batch, checked against a value worked out by hand.
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "reco/backend/cuda.cuh"
#include "reco/reco.hpp"

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

int main() {
  // One group of two responses, rewards 1 and 0, on-policy, two tokens each.
  const std::vector<double> logp = {-0.5, -1.0, -0.25, -2.0}, rewards = {1.0, 0.0};
  const std::vector<reco::index_t> groups = {0, 2};
  double* d_logp = to_device(logp);
  double* d_rewards = to_device(rewards);
  reco::index_t* d_groups = to_device(groups);
  double* d_grad = to_device(std::vector<double>(4, 0.0));
  reco::batch_view<double> b;
  b.layout = reco::padded(2, 2);
  b.group_offsets = {d_groups, 2};
  b.logp = {d_logp, 4};
  b.ref_logp = {d_logp, 4};  // KL term is 0
  b.rewards = {d_rewards, 2};
  const reco::objective_result r =
      reco::presets::reco{}(reco::cuda{}, b, reco::gradients<double>{reco::span<double>(d_grad, 4), {}});
  // On-policy every ratio is 1: A = +-0.5/(sqrt(0.5) + 1e-6), w_i = 1 / (2 exp(mean logp_i)).
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  const double w0 = 1.0 / (2.0 * std::exp(-0.75)), w1 = 1.0 / (2.0 * std::exp(-1.125));
  const double expected = (-w0 * a + w1 * a) / 2.0;
  if (std::fabs(r.loss - expected) > 1e-12) {
    std::printf("loss %.17g, expected %.17g\n", r.loss, expected);
    return 1;
  }
  std::printf("ok: loss %.6f on the GPU\n", r.loss);
  return 0;
}
