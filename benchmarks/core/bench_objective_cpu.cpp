// The per-token objective on the CPU backend: presets grpo, reco, dapo and rule_80_20 over
// ragged batches of about 8K, 256K and 4M tokens (G = 8), with the token pass on packs
// (".../packed", the default: SIMD, dispatched at run time to the widest instruction set the CPU
// runs, RECO_SIMD_LEVEL=baseline|avx2 caps it) and token by token (".../scalar", reco::cpu::vectorise =
// false). Reports tokens/s and compulsory bytes/s (each input read once, the gradient written
// once). The LibTorch eager baseline of the same formulas lives in benchmarks/torch (same binary
// there, same run).
#include <benchmark/benchmark.h>

#include <string>

#include "core/batch_fixture.hpp"
#include "reco/reco.hpp"

namespace {

using reco_bench::index_t;

// Compulsory bytes per token for a preset: logp, old_logp, mask, gradient; plus ref_logp with a
// KL term and entropy with a token selector.
template <class Obj>
double bytes_per_token() {
  double b = 4 + 4 + 1 + 4;
  if (Obj::needs_ref_logp) b += 4;
  if (Obj::needs_entropy) b += 4;
  return b;
}

template <class Obj, bool Packed>
void bm_objective(benchmark::State& state) {
  const auto batch = reco_bench::make_token_batch(state.range(0));
  auto grad = batch.grad;
  Obj obj;
  reco::workspace<reco::cpu> ws;
  reco::cpu backend;
  backend.vectorise = Packed;
  const auto view = batch.view();
  for (auto _ : state) {
    const auto r = obj(backend, view, reco::gradients<float>{grad, {}}, ws);
    benchmark::DoNotOptimize(r.loss);
    benchmark::ClobberMemory();
  }
  const double n = static_cast<double>(batch.N);
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] =
      benchmark::Counter(n * bytes_per_token<Obj>(), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1024);
  state.counters["tokens"] = n;
}

#define RECO_OBJECTIVE_BENCH_PATH(preset, packed, path)                                           \
  BENCHMARK_TEMPLATE(bm_objective, reco::presets::preset, packed)                                 \
      ->Name("objective_cpu/" #preset "/" path)                                                   \
      ->Arg(8 << 10)                                                                              \
      ->Arg(256 << 10)                                                                            \
      ->Arg(4 << 20)                                                                              \
      ->Unit(benchmark::kMillisecond)                                                             \
      ->UseRealTime();
#define RECO_OBJECTIVE_BENCH(preset)                \
  RECO_OBJECTIVE_BENCH_PATH(preset, true, "packed") \
  RECO_OBJECTIVE_BENCH_PATH(preset, false, "scalar")

RECO_OBJECTIVE_BENCH(grpo)
RECO_OBJECTIVE_BENCH(reco)
RECO_OBJECTIVE_BENCH(dapo)
RECO_OBJECTIVE_BENCH(rule_80_20)

}  // namespace

int main(int argc, char** argv) {
#if RECO_SIMD
  benchmark::AddCustomContext("reco packed token pass",
                              std::string(reco::simd::active_isa()) + ", " +
                                  std::to_string(reco::simd::active_width()) + " doubles per pack");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
