// GPU benchmark of the per-token objective: the fused CUDA path (reco::cuda_fused) against the
// generic passes (reco::cuda) on the same batches, with a device-to-device copy of the same
// traffic measured in the same binary (the method of docs/benchmarks-cuda.md).
//
//  objective/<impl>/<preset>/<kl|nokl>/N:<tokens>   impl in {fused, generic}; presets grpo, reco,
//      dapo, rule_80_20, each with and without a k3 KL term; N from 8K to 64M tokens
//  objective_presets/<impl>/<preset>/N:1048576       every preset at one size
//
// Batches: packed, 8 responses per prompt, lengths uniform in [128, 896] tokens (mean 512),
// about 5 % of tokens masked, binary rewards, float log-probs slightly off-policy; generated on
// the device. Each benchmark runs 3 warm-up calls, then 50 calls timed one by one with CUDA events
// around the enqueue (UseManualTime), and reports:
//   median_us, min_us, max_us    the 50 calls
//   GB/s                         compulsory bytes (each per-token input read once, the gradient
//                                written once) over the median time
//   copy_GB/s, vs_copy           a cudaMemcpyAsync D2D moving the same bytes (half read, half
//                                written), timed the same way; vs_copy = GB/s / copy_GB/s
//   graph_median_us, kernels     for N <= 256K: the call captured in a CUDA graph, 50 replays
//                                timed the same way, and the kernel nodes of one call
// Never run on the development machine (no GPU); see benchmarks/cuda/run_gpu_benchmarks.sh.
#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "reco/backend/cuda.cuh"
#include "reco/fused/objective.cuh"
#include "reco/fused/launch_config.hpp"
#include "reco/reco.hpp"

namespace {

using reco::index_t;
constexpr int repetitions = 50;
constexpr int warmup = 3;
constexpr index_t graph_limit = 256 << 10;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// ---- objectives: the four headline presets with the KL term switched ---------------------------

namespace ps = reco::presets;
using grpo_kl = ps::grpo;
struct grpo_nokl : reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                   reco::seq_mean_token_mean> {
  grpo_nokl() { ps::detail::grpo_clip(*this); }
};
using reco_kl = ps::reco;
struct reco_nokl : reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
                                   reco::expected_count_weight, reco::seq_mean_token_mean> {
  reco_nokl() {
    ps::detail::grpo_clip(*this);
    weight.params.cap = 10.0;
  }
};
using dapo_nokl = ps::dapo;
struct dapo_kl : reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                 reco::token_mean, reco::kl_penalty> {
  dapo_kl() {
    ps::detail::dapo_clip(*this);
    ps::detail::paper_kl(*this);
  }
};
using rule_nokl = ps::rule_80_20;
struct rule_kl : reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                 reco::token_mean, reco::top_entropy_selection, reco::kl_penalty> {
  rule_kl() {
    ps::detail::dapo_clip(*this);
    ps::detail::top_20_percent(*this);
    ps::detail::paper_kl(*this);
  }
};

// ---- device batches --------------------------------------------------------------------------

__device__ inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ inline float unit(std::uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

__global__ void fill_tokens(float* logp, float* old, float* ref, float* entropy, std::uint8_t* mask, index_t n) {
  for (index_t t = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t h = static_cast<std::uint64_t>(t) * 0x9e3779b97f4a7c15ull;
    const float u1 = unit(mix(h + 1)), u2 = unit(mix(h + 2)), u3 = unit(mix(h + 3)), u4 = unit(mix(h + 4));
    const float u5 = unit(mix(h + 5)), u6 = unit(mix(h + 6));
    const float lp = -3.0f * u1 * u2;
    logp[t] = lp;
    old[t] = fminf(lp + 0.2f * (u3 - 0.5f), 0.0f);
    ref[t] = fminf(lp + 0.4f * (u4 - 0.5f), 0.0f);
    entropy[t] = 4.0f * u5;
    mask[t] = u6 < 0.95f ? 1 : 0;
  }
}

template <class T>
struct buffer {
  T* ptr = nullptr;
  explicit buffer(index_t n) { check(cudaMalloc(&ptr, sizeof(T) * static_cast<std::size_t>(n > 0 ? n : 1)), "malloc"); }
  ~buffer() { cudaFree(ptr); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
};

struct device_batch {
  index_t R = 0, N = 0, P = 0;
  buffer<float> logp, old, ref, entropy, grad, rewards;
  buffer<std::uint8_t> mask;
  buffer<index_t> offsets, groups;

  static std::pair<std::vector<index_t>, std::vector<index_t>> layout(index_t tokens) {
    std::mt19937_64 rng(tokens);
    std::uniform_int_distribution<index_t> len(128, 896);
    std::vector<index_t> offsets = {0}, groups = {0};
    while (offsets.back() < tokens) {
      for (int j = 0; j < 8; ++j) offsets.push_back(offsets.back() + len(rng));
      groups.push_back(static_cast<index_t>(offsets.size()) - 1);
    }
    return {offsets, groups};
  }
  explicit device_batch(const std::pair<std::vector<index_t>, std::vector<index_t>>& l)
      : R(static_cast<index_t>(l.first.size()) - 1), N(l.first.back()), P(static_cast<index_t>(l.second.size()) - 1),
        logp(N), old(N), ref(N), entropy(N), grad(N), rewards(R), mask(N), offsets(R + 1), groups(P + 1) {
    check(cudaMemcpy(offsets.ptr, l.first.data(), sizeof(index_t) * l.first.size(), cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(groups.ptr, l.second.data(), sizeof(index_t) * l.second.size(), cudaMemcpyHostToDevice), "copy");
    std::vector<float> r(static_cast<std::size_t>(R));
    std::mt19937_64 rng(R);
    for (float& x : r) x = (rng() & 1) ? 1.0f : 0.0f;
    check(cudaMemcpy(rewards.ptr, r.data(), sizeof(float) * r.size(), cudaMemcpyHostToDevice), "copy");
    fill_tokens<<<1024, 256>>>(logp.ptr, old.ptr, ref.ptr, entropy.ptr, mask.ptr, N);
    check(cudaDeviceSynchronize(), "fill");
  }
  // The inputs an objective reads (ref_logp with a KL term, entropy with a selector).
  template <class Obj>
  reco::batch_view<float> view() const {
    reco::batch_view<float> v;
    v.layout = reco::packed(reco::span<const index_t>(offsets.ptr, R + 1));
    v.group_offsets = reco::span<const index_t>(groups.ptr, P + 1);
    v.logp = {logp.ptr, N};
    v.old_logp = {old.ptr, N};
    if (Obj::needs_ref_logp) v.ref_logp = {ref.ptr, N};
    if (Obj::needs_entropy) v.entropy = {entropy.ptr, N};
    v.mask = {mask.ptr, N};
    v.rewards = {rewards.ptr, R};
    return v;
  }
};

// One batch per size, shared by every benchmark of that size (generation is not timed).
device_batch& batch_of_size(index_t tokens) {
  static std::map<index_t, std::unique_ptr<device_batch>> cache;
  auto& slot = cache[tokens];
  if (!slot) {
    cache.clear();  // keep one size resident (64M tokens take 1.4 GB)
    auto& fresh = cache[tokens];
    fresh = std::make_unique<device_batch>(device_batch::layout(tokens));
    return *fresh;
  }
  return *slot;
}

// ---- timing ----------------------------------------------------------------------------------

struct summary {
  double median, min, max;
};
summary summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

class event_timer {
 public:
  explicit event_timer(cudaStream_t s) : stream_(s) {
    check(cudaEventCreate(&start_), "event");
    check(cudaEventCreate(&stop_), "event");
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class F>
  double time_us(F&& launch) {
    check(cudaEventRecord(start_, stream_), "record");
    launch();
    check(cudaEventRecord(stop_, stream_), "record");
    check(cudaEventSynchronize(stop_), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    return 1e3 * ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
};

// Median microseconds of a D2D copy of `bytes` (cached per size: one measurement per run).
double copy_median_us(std::size_t bytes, cudaStream_t stream) {
  static std::map<std::size_t, double> cache;
  const auto found = cache.find(bytes);
  if (found != cache.end()) return found->second;
  buffer<std::uint8_t> a(static_cast<index_t>(bytes)), b(static_cast<index_t>(bytes));
  check(cudaMemsetAsync(a.ptr, 1, bytes, stream), "memset");
  event_timer timer(stream);
  auto copy = [&] { check(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream), "copy"); };
  for (int i = 0; i < warmup; ++i) copy();
  std::vector<double> us;
  for (int i = 0; i < repetitions; ++i) us.push_back(timer.time_us(copy));
  return cache[bytes] = summarise(us).median;
}

template <class Obj>
double compulsory_bytes_per_token() {
  reco::fused::token_inputs in;
  in.ref_logp = Obj::needs_ref_logp;
  in.entropy = Obj::needs_entropy;
  in.entropy_gradient = Obj::has_entropy_gradient;
  return reco::fused::traffic_per_token(reco::fused::stages_of(Obj{}), in).compulsory;
}

template <class Obj, class Backend>
void run(benchmark::State& state, index_t tokens) {
  device_batch& batch = batch_of_size(tokens);
  const Obj obj;
  const auto view = batch.view<Obj>();
  const reco::gradients<float> grads{{batch.grad.ptr, batch.N}, {}};
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  {
    reco::workspace<Backend> ws;
    const Backend backend(stream);
    auto call = [&] { obj.run(backend, view, grads, ws); };
    for (int i = 0; i < warmup; ++i) call();
    check(cudaStreamSynchronize(stream), "warm-up");
    event_timer timer(stream);
    std::vector<double> us;
    for (auto _ : state) {
      const double t = timer.time_us(call);
      state.SetIterationTime(t * 1e-6);
      us.push_back(t);
    }
    const summary s = summarise(us);
    const double bytes = compulsory_bytes_per_token<Obj>() * static_cast<double>(batch.N);
    const double gbps = bytes / (s.median * 1e-6) / 1e9;
    const double copy_us = copy_median_us(static_cast<std::size_t>(bytes / 2), stream);
    const double copy_gbps = bytes / (copy_us * 1e-6) / 1e9;
    state.counters["median_us"] = s.median;
    state.counters["min_us"] = s.min;
    state.counters["max_us"] = s.max;
    state.counters["GB/s"] = gbps;
    state.counters["copy_GB/s"] = copy_gbps;
    state.counters["vs_copy"] = gbps / copy_gbps;
    state.counters["tokens"] = static_cast<double>(batch.N);
    state.counters["bytes/token"] = compulsory_bytes_per_token<Obj>();

    if (batch.N <= graph_limit) {
      // The call as a CUDA graph: launch latency out of the picture, kernels counted.
      cudaGraph_t graph;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
      call();
      check(cudaStreamEndCapture(stream, &graph), "capture");
      std::size_t count = 0;
      check(cudaGraphGetNodes(graph, nullptr, &count), "nodes");
      std::vector<cudaGraphNode_t> nodes(count);
      check(cudaGraphGetNodes(graph, nodes.data(), &count), "nodes");
      int kernels = 0;
      for (auto n : nodes) {
        cudaGraphNodeType type;
        check(cudaGraphNodeGetType(n, &type), "node type");
        kernels += type == cudaGraphNodeTypeKernel;
      }
      cudaGraphExec_t exec;
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      auto replay = [&] { check(cudaGraphLaunch(exec, stream), "graph launch"); };
      for (int i = 0; i < warmup; ++i) replay();
      std::vector<double> gus;
      for (int i = 0; i < repetitions; ++i) gus.push_back(timer.time_us(replay));
      state.counters["graph_median_us"] = summarise(gus).median;
      state.counters["kernels"] = kernels;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    check(cudaStreamSynchronize(stream), "sync");
  }
  cudaStreamDestroy(stream);
}

template <class Obj>
void register_pair(const std::string& name, index_t tokens, const std::string& group) {
  for (bool fused : {true, false}) {
    const std::string full = group + (fused ? "/fused/" : "/generic/") + name + "/N:" + std::to_string(tokens);
    auto* b = fused ? benchmark::RegisterBenchmark(full.c_str(), [=](benchmark::State& s) { run<Obj, reco::cuda_fused>(s, tokens); })
                    : benchmark::RegisterBenchmark(full.c_str(), [=](benchmark::State& s) { run<Obj, reco::cuda>(s, tokens); });
    b->UseManualTime()->Iterations(repetitions)->Unit(benchmark::kMicrosecond);
  }
}

void register_all() {
  const std::vector<index_t> sizes = {8 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  for (index_t n : sizes) {
    register_pair<grpo_kl>("grpo/kl", n, "objective");
    register_pair<grpo_nokl>("grpo/nokl", n, "objective");
    register_pair<reco_kl>("reco/kl", n, "objective");
    register_pair<reco_nokl>("reco/nokl", n, "objective");
    register_pair<dapo_kl>("dapo/kl", n, "objective");
    register_pair<dapo_nokl>("dapo/nokl", n, "objective");
    register_pair<rule_kl>("rule_80_20/kl", n, "objective");
    register_pair<rule_nokl>("rule_80_20/nokl", n, "objective");
  }
  const index_t one = 1 << 20;
  register_pair<ps::grpo>("grpo", one, "objective_presets");
  register_pair<ps::dr_grpo>("dr_grpo", one, "objective_presets");
  register_pair<ps::dapo>("dapo", one, "objective_presets");
  register_pair<ps::gspo>("gspo", one, "objective_presets");
  register_pair<ps::cispo>("cispo", one, "objective_presets");
  register_pair<ps::aspo>("aspo", one, "objective_presets");
  register_pair<ps::reco>("reco", one, "objective_presets");
  register_pair<ps::reco_no_cap>("reco_no_cap", one, "objective_presets");
  register_pair<ps::reco_response_only>("reco_response_only", one, "objective_presets");
  register_pair<ps::reco_token_only>("reco_token_only", one, "objective_presets");
  register_pair<ps::dapo_reco>("dapo_reco", one, "objective_presets");
  register_pair<ps::rule_80_20>("rule_80_20", one, "objective_presets");
  register_pair<ps::rule_80_20_reco>("rule_80_20_reco", one, "objective_presets");
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "reco_bench_objective_cuda: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("sms", std::to_string(prop.multiProcessorCount));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
