// The CUDA adapter's C++ interface from a host-compiled program: the override checks (no GPU
// needed) and, where a GPU exists, the ReCo loss on a tiny batch against a hand-worked value.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "reco/cuda_adapter/adapter.hpp"

template <class T>
T* to_device(const std::vector<T>& h) {
  void* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(d);
}

int main() {
  try {
    reco::cuda_adapter::check_overrides("reco", {{"weight.no_such_key", 1.0}});
    std::printf("an unknown override key was accepted\n");
    return 1;
  } catch (const reco::error& e) {
    if (std::string(e.what()).find("overrides.weight.no_such_key") == std::string::npos) {
      std::printf("the error does not name the key: %s\n", e.what());
      return 1;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("ok: host checks (no GPU: the objective was not run)\n");
    return 0;
  }
  // One group of two responses, rewards 1 and 0, on-policy, two tokens each (float64).
  const std::vector<double> logp = {-0.5, -1.0, -0.25, -2.0}, rewards = {1.0, 0.0};
  reco_cuda_objective_args args{};
  args.dtype = RECO_CUDA_FLOAT64;
  args.responses = 2;
  args.tokens = 4;
  args.max_length = 2;
  args.groups = 1;
  args.group_offsets = to_device(std::vector<int64_t>{0, 2});
  args.logp = to_device(logp);
  args.ref_logp = args.logp;  // KL term is 0
  args.rewards = to_device(rewards);
  args.grad_logp = to_device(std::vector<double>(4, 0.0));
  reco::cuda_adapter::context ctx;
  const reco::objective_result r = reco::cuda_adapter::run_preset("reco", args, nullptr, ctx);
  // On-policy every ratio is 1: A = +-0.5/(sqrt(0.5) + 1e-6), w_i = 1 / (2 exp(mean logp_i)).
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  const double w0 = 1.0 / (2.0 * std::exp(-0.75)), w1 = 1.0 / (2.0 * std::exp(-1.125));
  const double expected = (-w0 * a + w1 * a) / 2.0;
  if (std::fabs(r.loss - expected) > 1e-12) {
    std::printf("loss %.17g, expected %.17g\n", r.loss, expected);
    return 1;
  }
  std::printf("ok: host checks; loss %.6f on the GPU\n", r.loss);
  return 0;
}
