// CPU benchmarks of reco::eval: Self-BLEU-4 over 1,024 responses of 512 token ids, pass@k for
// 1,000 problems x 1,024 samples x k in {1, 2, 4, ..., 1024}, and a few smaller companions.
// Where a benchmark takes an argument it is the number of OpenMP threads (1 = single core); one
// set's Self-BLEU is a serial computation (the parallel loops are over prompts and problems).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "reco/eval/bleu.hpp"
#include "reco/eval/distinct_n.hpp"
#include "reco/eval/kde.hpp"
#include "reco/eval/pass_at_k.hpp"

namespace ev = reco::eval;

namespace {

int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void use_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

void thread_args(benchmark::internal::Benchmark* b) {
  b->Arg(1);
  if (max_threads() > 1) b->Arg(max_threads());
}

// Responses of `length` token ids drawn from 1..500; half of them open with one of 8 shared
// prefixes of 32-128 tokens (rollouts of one prompt often start alike), the rest is random.
std::vector<ev::token_ids> make_responses(int count, int length, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> token(1, 500);
  std::vector<ev::token_ids> prefixes(8);
  for (auto& p : prefixes) {
    p.resize(std::uniform_int_distribution<std::size_t>(32, 128)(rng));
    for (auto& t : p) t = token(rng);
  }
  std::vector<ev::token_ids> out(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto& r = out[i];
    if (i % 2 == 0) r = prefixes[(i / 2) % prefixes.size()];
    while (r.size() < static_cast<std::size_t>(length)) r.push_back(token(rng));
  }
  return out;
}

void BM_SelfBleu4_1024x512(benchmark::State& state) {
  use_threads(1);
  const auto responses = make_responses(1024, 512, 1);
  ev::bleu_params p;  // BLEU-4, method1
  for (auto _ : state) benchmark::DoNotOptimize(ev::self_bleu(responses, p));
  state.SetItemsProcessed(state.iterations() * 1024);  // hypotheses scored
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 1024 * 512, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SelfBleu4_1024x512)->Unit(benchmark::kMillisecond)->UseRealTime();

// The pairwise way: every hypothesis re-counts its K - 1 references (O(K^2 L)), as calling
// sentence_bleu K times does. Shown at K = 128 next to the set form on the same data.
void BM_SelfBleu4_Pairwise_128x512(benchmark::State& state) {
  use_threads(1);
  const auto responses = make_responses(128, 512, 2);
  ev::bleu_params p;
  for (auto _ : state) {
    double sum = 0;
    for (std::size_t h = 0; h < responses.size(); ++h) {
      std::vector<ev::token_ids> refs;
      for (std::size_t j = 0; j < responses.size(); ++j)
        if (j != h) refs.push_back(responses[j]);
      sum += ev::sentence_bleu(refs, responses[h], p);
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_SelfBleu4_Pairwise_128x512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SelfBleu4_128x512(benchmark::State& state) {
  use_threads(1);
  const auto responses = make_responses(128, 512, 2);
  ev::bleu_params p;
  for (auto _ : state) benchmark::DoNotOptimize(ev::self_bleu(responses, p));
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_SelfBleu4_128x512)->Unit(benchmark::kMillisecond)->UseRealTime();

// The paper's diversity table shape: many prompts, 16 rollouts each, Self-BLEU among correct.
void BM_SelfBleuAmongCorrect_512x16x512(benchmark::State& state) {
  use_threads(static_cast<int>(state.range(0)));
  std::vector<std::vector<ev::token_ids>> prompts;
  std::vector<std::vector<bool>> correct;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 512; ++i) {
    prompts.push_back(make_responses(16, 512, 100 + static_cast<std::uint64_t>(i)));
    std::vector<bool> c(16);
    for (std::size_t j = 0; j < c.size(); ++j) c[j] = (rng() % 3) != 0;
    correct.push_back(c);
  }
  for (auto _ : state) benchmark::DoNotOptimize(ev::self_bleu_among_correct(prompts, correct).mean);
  state.SetItemsProcessed(state.iterations() * 512);  // prompts
}
BENCHMARK(BM_SelfBleuAmongCorrect_512x16x512)->Apply(thread_args)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Distinct4_Pooled_1024x512(benchmark::State& state) {
  use_threads(1);
  const auto responses = make_responses(1024, 512, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ev::distinct_n(responses, 4));
  state.SetItemsProcessed(state.iterations() * 1024);
}
BENCHMARK(BM_Distinct4_Pooled_1024x512)->Unit(benchmark::kMillisecond)->UseRealTime();

// 1,000 problems with n = 1,024 samples; c spread over [0, n] with many all-wrong and
// all-right problems, as on a real benchmark; k = 1, 2, 4, ..., 1024.
void BM_PassAtKCurve_1000x1024(benchmark::State& state) {
  use_threads(static_cast<int>(state.range(0)));
  std::mt19937_64 rng(4);
  std::vector<std::int64_t> ns(1000, 1024), cs(1000);
  for (auto& c : cs) {
    const auto kind = rng() % 4;
    c = kind == 0 ? 0 : (kind == 1 ? 1024 : static_cast<std::int64_t>(rng() % 1025));
  }
  std::vector<std::int64_t> ks;
  for (std::int64_t k = 1; k <= 1024; k *= 2) ks.push_back(k);
  for (auto _ : state) benchmark::DoNotOptimize(ev::pass_at_k_curve(ns, cs, ks).mean.data());
  state.SetItemsProcessed(state.iterations() * 1000 * static_cast<std::int64_t>(ks.size()));  // (problem, k) values
}
BENCHMARK(BM_PassAtKCurve_1000x1024)->Apply(thread_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GaussianKde_10000(benchmark::State& state) {
  use_threads(1);
  std::mt19937_64 rng(5);
  std::normal_distribution<double> d(-0.6, 0.2);
  std::vector<double> x(10000);
  for (auto& v : x) v = d(rng);
  for (auto _ : state) benchmark::DoNotOptimize(ev::gaussian_kde(x).density.data());
}
BENCHMARK(BM_GaussianKde_10000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
