// CPU benchmarks of reco::logits: forward (logp + entropy + lse) and forward + backward (out of
// place), N in {1K, 4K} rows, V in {32,000, 151,936}, fp32 and bf16 logits, temperature 0.7.
// Throughput counts compulsory bytes only: forward reads the logits once; forward + backward reads
// them twice and writes dlogits once (per-row scalars included, they are negligible). All OpenMP
// threads are used; the "threads" counter says how many.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

namespace {

namespace rl = reco::logits;

int threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Roughly normal logits (sum of four uniforms, sd ~3) from a cheap counter hash, so that filling
// gigabytes takes well under a second per benchmark.
float pseudo_normal(std::uint64_t i) {
  float sum = 0;
  for (int k = 0; k < 4; ++k) {
    std::uint64_t z = (i * 4 + static_cast<std::uint64_t>(k) + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    sum += static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  }
  return (sum - 2.0f) * 5.2f;
}

template <class T>
struct problem {
  using A = rl::accum_t<T>;
  reco::index_t rows, vocab;
  std::vector<T> logits, dlogits;
  std::vector<std::int64_t> tokens;
  std::vector<A> logp, entropy, lse, grad_logp, grad_entropy;

  problem(reco::index_t n, reco::index_t v, bool with_backward)
      : rows(n), vocab(v), logits(static_cast<std::size_t>(n * v)), tokens(static_cast<std::size_t>(n)),
        logp(tokens.size()), entropy(tokens.size()), lse(tokens.size()), grad_logp(tokens.size(), A(1)),
        grad_entropy(tokens.size(), A(-0.01)) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (reco::index_t i = 0; i < n * v; ++i) logits[static_cast<std::size_t>(i)] = T(pseudo_normal(static_cast<std::uint64_t>(i)));
    for (reco::index_t r = 0; r < n; ++r) tokens[static_cast<std::size_t>(r)] = (r * 7919) % v;
    if (with_backward) dlogits.resize(logits.size());
  }
  void forward(double tau) {
    rl::forward(logits.data(), rows, vocab, vocab, tokens.data(), tau, nullptr, logp.data(), entropy.data(), lse.data());
  }
  void backward(double tau) {
    rl::backward(logits.data(), rows, vocab, vocab, tokens.data(), tau, nullptr, grad_logp.data(), grad_entropy.data(),
                 lse.data(), entropy.data(), dlogits.data());
  }
};

template <class T>
void report(benchmark::State& state, double logit_passes, reco::index_t n, reco::index_t v) {
  const double bytes = logit_passes * static_cast<double>(n) * static_cast<double>(v) * sizeof(T) +
                       static_cast<double>(n) * (sizeof(std::int64_t) + 3 * sizeof(rl::accum_t<T>));
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["threads"] = threads();
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void BM_logits_forward(benchmark::State& state) {
  problem<T> p(state.range(0), state.range(1), false);
  for (auto _ : state) {
    p.forward(0.7);
    benchmark::DoNotOptimize(p.logp.data());
    benchmark::ClobberMemory();
  }
  report<T>(state, 1, p.rows, p.vocab);
}

template <class T>
void BM_logits_forward_backward(benchmark::State& state) {
  problem<T> p(state.range(0), state.range(1), true);
  for (auto _ : state) {
    p.forward(0.7);
    p.backward(0.7);
    benchmark::DoNotOptimize(p.dlogits.data());
    benchmark::ClobberMemory();
  }
  report<T>(state, 3, p.rows, p.vocab);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "V"});
  for (std::int64_t n : {1024, 4096})
    for (std::int64_t v : {32000, 151936}) b->Args({n, v});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_TEMPLATE(BM_logits_forward, float)->Apply(shapes);
BENCHMARK_TEMPLATE(BM_logits_forward, reco::bf16_t)->Apply(shapes);
BENCHMARK_TEMPLATE(BM_logits_forward_backward, float)->Apply(shapes);
BENCHMARK_TEMPLATE(BM_logits_forward_backward, reco::bf16_t)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
