// The LibTorch eager baseline on CUDA, in the same binary as reco's fused path on the same
// tensors (a baseline always runs in the same binary and the same run as what it is compared with).
//
//  objective_torch/<impl>/<preset>/N:<tokens>   impl in {torch_eager, reco_fused};
//      presets grpo (k3 KL), reco (k3 KL), dapo, rule_80_20; N valid tokens from 8K to 64M
//
// The batch is what TRL and verl hold: padded [R, T] float tensors (T = 896, lengths uniform in
// [128, 896], 8 responses per prompt, 5 % of tokens masked inside the responses), rewards [R].
// torch_eager composes the preset's formulas from ATen ops the way those trainers write them
// (group statistics by view(-1, G), clamp/exp/max chains, masked means) and back-propagates
// into logp with autograd, then reads the loss and four clip/KL metrics with .item() as the
// trainers log them (five synchronisations). reco_fused runs the same preset through the raw
// adapter's C interface (reco_cuda_objective, result left in the workspace) on the same tensors'
// device pointers, writing the gradient and every diagnostic without a synchronisation. The C
// interface keeps this file independent of the C++ ABI the LibTorch was built with. Each benchmark times 50 calls one
// by one with CUDA events on PyTorch's current stream (UseManualTime) after 3 warm-up calls and
// reports median_us, min_us, max_us; run_gpu_benchmarks.sh turns them into ratios.
// Built only against a LibTorch with CUDA (see CMakeLists.txt).
#include <benchmark/benchmark.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "reco/cuda_adapter/reco_cuda.h"

namespace {

constexpr int repetitions = 50;
constexpr int warmup = 3;
constexpr std::int64_t group_size = 8;
constexpr std::int64_t max_len = 896;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct padded_batch {
  std::int64_t R = 0, P = 0, valid = 0;
  torch::Tensor logp, old_logp, ref_logp, entropy, mask, maskf, rewards, group_offsets, grad;

  explicit padded_batch(std::int64_t tokens) {
    const auto dev = torch::TensorOptions().device(torch::kCUDA);
    torch::manual_seed(static_cast<std::uint64_t>(tokens));
    P = std::max<std::int64_t>(1, tokens / (512 * group_size));
    R = P * group_size;
    const auto lengths = torch::randint(128, max_len + 1, {R, 1}, dev.dtype(torch::kLong));
    const auto pos = torch::arange(max_len, dev.dtype(torch::kLong)).unsqueeze(0);
    const auto holes = torch::rand({R, max_len}, dev) < 0.05;
    mask = ((pos < lengths) & ~holes).to(torch::kUInt8).contiguous();
    maskf = mask.to(torch::kFloat);
    valid = maskf.sum().item<std::int64_t>();
    const auto u1 = torch::rand({R, max_len}, dev), u2 = torch::rand({R, max_len}, dev);
    logp = (-3.0 * u1 * u2).contiguous();
    old_logp = torch::clamp_max(logp + 0.2 * (torch::rand({R, max_len}, dev) - 0.5), 0.0).contiguous();
    ref_logp = torch::clamp_max(logp + 0.4 * (torch::rand({R, max_len}, dev) - 0.5), 0.0).contiguous();
    entropy = (4.0 * torch::rand({R, max_len}, dev)).contiguous();
    rewards = (torch::rand({R}, dev) < 0.5).to(torch::kFloat).contiguous();
    group_offsets = (torch::arange(P + 1, dev.dtype(torch::kLong)) * group_size).contiguous();
    grad = torch::empty_like(logp);
  }
};

padded_batch& batch_of_size(std::int64_t tokens) {
  static std::map<std::int64_t, std::unique_ptr<padded_batch>> cache;
  auto found = cache.find(tokens);
  if (found != cache.end()) return *found->second;
  cache.clear();
  return *(cache[tokens] = std::make_unique<padded_batch>(tokens));
}

// ---- the eager composites --------------------------------------------------------------------

torch::Tensor grpo_advantages(const padded_batch& b) {
  const auto s = b.rewards.view({-1, group_size});
  const auto a = (s - s.mean(1, true)) / (s.std(1, /*unbiased=*/true, true) + 1e-6);
  return a.view({-1, 1});
}

torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& m) { return (x * m).sum() / m.sum().clamp_min(1); }

struct eager_config {
  double eps_low = 0.2, eps_high = 0.2, dual_c = 3.0, beta = 0.0;
  bool variance_ratio = false, response_weight = false, token_mean = false, top_entropy = false;
};

// One training-step loss: forward, backward into logp, the logged metrics.
void eager_step(const padded_batch& b, const eager_config& c) {
  const auto A = grpo_advantages(b);
  auto lp = b.logp.detach().requires_grad_(true);
  torch::Tensor ratio;
  if (c.variance_ratio) {
    // p (1 - sg p) / (p_old (1 - p_old)), both variances floored at 1e-12 (ReCo).
    const auto p = lp.exp();
    const auto var_new = (p * (1 - p.detach())).clamp_min(1e-12);
    const auto var_old = (b.old_logp.exp() * -torch::expm1(b.old_logp)).clamp_min(1e-12);
    ratio = var_new / var_old;
  } else {
    ratio = torch::clamp(lp - b.old_logp, -20.0, 20.0).exp();
  }
  const auto pg1 = -A * ratio;
  const auto pg2 = -A * torch::clamp(ratio, 1 - c.eps_low, 1 + c.eps_high);
  const auto clip1 = torch::maximum(pg1, pg2);
  const auto clip2 = torch::minimum(-A * c.dual_c, clip1);
  auto per_token = torch::where(A < 0, clip2, clip1);
  auto policy_mask = b.maskf;
  if (c.top_entropy) {
    const auto valid_h = b.entropy.masked_select(b.mask.to(torch::kBool));
    const std::int64_t k = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(0.2 * valid_h.numel())));
    const auto threshold = std::get<0>(valid_h.topk(k)).min();  // .topk sorts on the device
    policy_mask = b.maskf * (b.entropy >= threshold).to(torch::kFloat);
  }
  if (c.response_weight) {
    const auto n = b.maskf.sum(1, true);
    const auto old_mean = (b.old_logp * b.maskf).sum(1, true) / n.clamp_min(1);
    const auto w = torch::where(n > 0, torch::exp(-std::log(static_cast<double>(group_size)) - old_mean).clamp_max(10.0),
                                torch::zeros_like(n));
    per_token = per_token * w;
  }
  per_token = per_token * policy_mask;
  torch::Tensor kl;
  if (c.beta > 0) {
    const auto d = torch::clamp(b.ref_logp - lp, -20.0, 20.0);
    kl = torch::clamp(d.exp() - d - 1, -10.0, 10.0);
    per_token = per_token + c.beta * kl * b.maskf;
  }
  torch::Tensor loss;
  if (c.token_mean) {
    loss = per_token.sum() / b.maskf.sum().clamp_min(1);
  } else {
    const auto n = b.maskf.sum(1);
    loss = ((per_token.sum(1) / n.clamp_min(1)).sum()) / (n > 0).sum().clamp_min(1);
  }
  loss.backward();
  // The metrics a trainer logs, each read with .item().
  const auto clipped = (pg2 > pg1).to(torch::kFloat);
  volatile double sink = loss.item<double>();
  sink = masked_mean(clipped, b.maskf).item<double>();
  sink = masked_mean(clipped * (A < 0).to(torch::kFloat), b.maskf).item<double>();
  sink = masked_mean((b.old_logp - lp.detach()), b.maskf).item<double>();
  sink = kl.defined() ? masked_mean(kl.detach(), b.maskf).item<double>() : 0.0;
  (void)sink;
}

eager_config config_of(const std::string& preset) {
  eager_config c;
  if (preset == "grpo") c.beta = 0.001;
  if (preset == "reco") c.beta = 0.001, c.variance_ratio = true, c.response_weight = true;
  if (preset == "dapo" || preset == "rule_80_20") c.eps_high = 0.28, c.dual_c = 10.0, c.token_mean = true;
  if (preset == "rule_80_20") c.top_entropy = true;
  return c;
}

// ---- reco through the raw adapter on the same tensors ----------------------------------------

reco_cuda_objective_args args_of(padded_batch& b) {
  reco_cuda_objective_args a{};
  a.dtype = RECO_CUDA_FLOAT32;
  a.responses = b.R;
  a.tokens = b.R * max_len;
  a.max_length = max_len;
  a.groups = b.P;
  a.group_offsets = b.group_offsets.data_ptr<std::int64_t>();
  a.logp = b.logp.data_ptr<float>();
  a.old_logp = b.old_logp.data_ptr<float>();
  a.ref_logp = b.ref_logp.data_ptr<float>();
  a.entropy = b.entropy.data_ptr<float>();
  a.mask = b.mask.data_ptr<std::uint8_t>();
  a.rewards = b.rewards.data_ptr<float>();
  a.grad_logp = b.grad.data_ptr<float>();
  return a;
}

struct summary {
  double median, min, max;
};
summary summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

template <class F>
void timed(benchmark::State& state, cudaStream_t stream, F&& step, const padded_batch& b) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < warmup; ++i) step();
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> us;
  for (auto _ : state) {
    check(cudaEventRecord(start, stream), "record");
    step();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    state.SetIterationTime(ms * 1e-3);
    us.push_back(1e3 * ms);
  }
  const summary s = summarise(us);
  state.counters["median_us"] = s.median;
  state.counters["min_us"] = s.min;
  state.counters["max_us"] = s.max;
  state.counters["valid_tokens"] = static_cast<double>(b.valid);
  state.counters["padded_tokens"] = static_cast<double>(b.R * max_len);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void run(benchmark::State& state, const std::string& impl, const std::string& preset, std::int64_t tokens) {
  torch::NoGradGuard no_grad_outside;  // the eager step enables grad where it needs it
  padded_batch& b = batch_of_size(tokens);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (impl == "torch_eager") {
    const eager_config c = config_of(preset);
    timed(state, stream, [&] {
      torch::AutoGradMode grad_on(true);
      eager_step(b, c);
    }, b);
  } else {
    static reco_cuda_context* ctx = reco_cuda_context_create();
    const reco_cuda_objective_args args = args_of(b);
    const reco_cuda_result* in_workspace = nullptr;
    timed(state, stream, [&] {
      if (reco_cuda_objective(ctx, preset.c_str(), &args, stream, RECO_CUDA_RESULT_WORKSPACE, nullptr,
                              &in_workspace) != RECO_CUDA_OK)
        throw std::runtime_error(reco_cuda_last_error());
    }, b);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "reco_bench_objective_torch_cuda: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("torch", TORCH_VERSION);
  for (std::int64_t n : {8 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20})
    for (const char* preset : {"grpo", "reco", "dapo", "rule_80_20"})
      for (const char* impl : {"torch_eager", "reco_fused"}) {
        const std::string name =
            std::string("objective_torch/") + impl + "/" + preset + "/N:" + std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, impl, preset, n); })
            ->UseManualTime()
            ->Iterations(repetitions)
            ->Unit(benchmark::kMicrosecond);
      }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
