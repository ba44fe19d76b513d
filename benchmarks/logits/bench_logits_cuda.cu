// GPU benchmarks of reco::logits over the sweep: V in {32,000, 128,256,
// 151,936, 262,144} x N in {1K, 8K, 32K, 70K} x {bf16, fp16, fp32}, temperature 0.7, about 30 % of
// the rows masked; forward (logp + entropy + lse) and forward + backward (dlogits out of place).
//
// Each benchmark times 50 iterations one by one with CUDA events (UseManualTime) after 3 warm-up
// launches, and reports the median time, the spread (min, max), the compulsory-bytes bandwidth at
// the median, and its ratio to a device-to-device cudaMemcpy of the logits' size timed the same
// way in the same process (copy GB/s counts the copy's read and its write).
// Compulsory bytes: forward reads the unmasked rows' logits once (masked rows are never read) and
// writes the per-row outputs; forward + backward adds the backward's read of the unmasked rows and
// one write of every dlogits row (masked rows get zeros), plus the per-row data.
// Shapes whose logits and second buffer do not fit in free device memory are skipped with a message.
#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.cuh"

namespace {

namespace rl = reco::logits;

constexpr int repetitions = 50;
constexpr int warmup = 3;
constexpr double temperature = 0.7;
constexpr double masked_fraction = 0.3;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__device__ inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Roughly normal logits (sum of four uniforms, sd ~3).
template <class T>
__global__ void fill_logits(T* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) sum += static_cast<float>(mix((i * 4 + k + 1) * 0x9e3779b97f4a7c15ull) >> 40) * (1.0f / 16777216.0f);
    x[i] = T((sum - 2.0f) * 5.2f);
  }
}

__global__ void fill_rows(std::int64_t* tokens, std::uint8_t* mask, std::int64_t rows, std::int64_t vocab) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t h = mix(static_cast<std::uint64_t>(r) * 0x9e3779b97f4a7c15ull + 12345);
    tokens[r] = static_cast<std::int64_t>(h % static_cast<std::uint64_t>(vocab));
    mask[r] = (h >> 32) % 1000 >= static_cast<std::uint64_t>(masked_fraction * 1000) ? 1 : 0;
  }
}

// Milliseconds of one launch (or chain of launches) on the default stream, by CUDA events.
class event_timer {
 public:
  event_timer() {
    check(cudaEventCreate(&start_), "event");
    check(cudaEventCreate(&stop_), "event");
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class F>
  double time(F&& launch) {
    check(cudaEventRecord(start_), "record");
    launch();
    check(cudaEventRecord(stop_), "record");
    check(cudaEventSynchronize(stop_), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    return ms;
  }

 private:
  cudaEvent_t start_, stop_;
};

struct summary {
  double median, min, max;
};
summary summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

std::string type_name(float*) { return "fp32"; }
std::string type_name(reco::bf16_t*) { return "bf16"; }
std::string type_name(reco::f16_t*) { return "fp16"; }

template <class T>
void run(benchmark::State& state, std::int64_t rows, std::int64_t vocab, bool with_backward) {
  using A = rl::accum_t<T>;
  const std::size_t elems = static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab);
  const std::size_t logit_bytes = elems * sizeof(T);
  std::size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (2 * logit_bytes + (std::size_t(1) << 30) > free_bytes) {
    state.SkipWithError(("needs 2 x " + std::to_string(logit_bytes >> 20) + " MiB of device memory, " +
                         std::to_string(free_bytes >> 20) + " MiB free")
                            .c_str());
    for (auto _ : state) {
    }
    return;
  }
  T *logits = nullptr, *second = nullptr;
  std::int64_t* tokens = nullptr;
  std::uint8_t* mask = nullptr;
  A *logp = nullptr, *entropy = nullptr, *lse = nullptr, *g = nullptr, *gh = nullptr;
  check(cudaMalloc(&logits, logit_bytes), "malloc");
  check(cudaMalloc(&second, logit_bytes), "malloc");
  check(cudaMalloc(&tokens, sizeof(std::int64_t) * rows), "malloc");
  check(cudaMalloc(&mask, rows), "malloc");
  for (A** p : {&logp, &entropy, &lse, &g, &gh}) check(cudaMalloc(p, sizeof(A) * rows), "malloc");
  fill_logits<<<4096, 256>>>(logits, static_cast<std::int64_t>(elems));
  fill_rows<<<256, 256>>>(tokens, mask, rows, vocab);
  check(cudaMemset(g, 0, sizeof(A) * rows), "memset");  // any finite upstream values do
  check(cudaMemset(gh, 0, sizeof(A) * rows), "memset");
  std::vector<std::uint8_t> host_mask(static_cast<std::size_t>(rows));
  check(cudaMemcpy(host_mask.data(), mask, rows, cudaMemcpyDeviceToHost), "copy mask");
  const double unmasked = static_cast<double>(std::count(host_mask.begin(), host_mask.end(), 1));

  auto forward = [&] {
    rl::forward_cuda(logits, rows, vocab, vocab, tokens, temperature, mask, logp, entropy, lse, nullptr);
  };
  auto forward_backward = [&] {
    forward();
    rl::backward_cuda(logits, rows, vocab, vocab, tokens, temperature, mask, g, gh, lse, entropy, second, nullptr);
  };
  event_timer timer;
  auto copy_once = [&] { check(cudaMemcpyAsync(second, logits, logit_bytes, cudaMemcpyDeviceToDevice), "copy"); };
  for (int i = 0; i < warmup; ++i) copy_once();
  std::vector<double> copy_ms;
  for (int i = 0; i < repetitions; ++i) copy_ms.push_back(timer.time(copy_once));
  const summary copy = summarise(copy_ms);

  for (int i = 0; i < warmup; ++i) with_backward ? forward_backward() : forward();
  std::vector<double> kernel_ms;
  for (auto _ : state) {
    const double ms = with_backward ? timer.time(forward_backward) : timer.time(forward);
    state.SetIterationTime(ms * 1e-3);
    kernel_ms.push_back(ms);
  }
  check(cudaGetLastError(), "kernels");
  const summary kernel = summarise(kernel_ms);
  const double row_bytes = static_cast<double>(rows) * (sizeof(std::int64_t) + 1 + 3 * sizeof(A));
  const double v_bytes = static_cast<double>(vocab) * sizeof(T);
  const double bytes = with_backward ? 2 * unmasked * v_bytes + static_cast<double>(rows) * v_bytes + row_bytes +
                                           static_cast<double>(rows) * 2 * sizeof(A)
                                     : unmasked * v_bytes + row_bytes;
  const double gbps = bytes / (kernel.median * 1e-3) / 1e9;
  const double copy_gbps = 2.0 * static_cast<double>(logit_bytes) / (copy.median * 1e-3) / 1e9;
  state.counters["median_ms"] = kernel.median;
  state.counters["min_ms"] = kernel.min;
  state.counters["max_ms"] = kernel.max;
  state.counters["GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy_gbps;
  state.counters["vs_copy"] = gbps / copy_gbps;
  state.counters["unmasked_rows"] = unmasked;

  for (void* p : {static_cast<void*>(logits), static_cast<void*>(second), static_cast<void*>(tokens),
                  static_cast<void*>(mask), static_cast<void*>(logp), static_cast<void*>(entropy),
                  static_cast<void*>(lse), static_cast<void*>(g), static_cast<void*>(gh)})
    cudaFree(p);
}

template <class T>
void register_type() {
  for (std::int64_t vocab : {32000, 128256, 151936, 262144})
    for (std::int64_t rows : {1024, 8192, 32768, 70000})
      for (bool with_backward : {false, true}) {
        const std::string name = std::string(with_backward ? "logits_forward_backward/" : "logits_forward/") +
                                 type_name(static_cast<T*>(nullptr)) + "/V:" + std::to_string(vocab) +
                                 "/N:" + std::to_string(rows);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run<T>(s, rows, vocab, with_backward); })
            ->UseManualTime()
            ->Iterations(repetitions)
            ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_logits_cuda: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  register_type<reco::bf16_t>();
  register_type<reco::f16_t>();
  register_type<float>();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
