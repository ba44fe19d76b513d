// The per-token objective on the CPU backend: presets grpo, reco, dapo and rule_80_20 (and each
// as a composition chosen at run time, "composed_cpu/..."; clip_cov and kl_cov on packs) over
// ragged batches of about 8K, 256K, 4M and (packed only) 16M tokens (G = 8), with the token pass
// on packs (".../packed", the default: SIMD, dispatched at run time to the widest instruction set
// the CPU runs, RECO_SIMD_LEVEL=baseline|avx2 caps it), on packs without token diagnostics
// (".../packed_no_diagnostics", reco::cpu::diagnostics = false), on packs with the inputs in
// double (".../packed_f64": the same values widened; the bytes counted are the float batch's) and
// token by token (".../scalar", reco::cpu::vectorise = false). Reports tokens/s and compulsory
// bytes/s.
//
// The machine's limit sits in the same binary: "copy_cpu/<preset>/N" moves exactly the preset's
// compulsory bytes with memcpy, on as many OpenMP threads as the objective uses (OMP_NUM_THREADS),
// so copy time / objective time is the fraction of copy bandwidth the preset reaches
// (benchmarks/core/summarize_copy.py prints it from the JSON output). The LibTorch
// eager baseline of the same formulas lives in benchmarks/torch (same binary there, same run).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "core/batch_fixture.hpp"
#include "reco/composition.hpp"
#include "reco/reco.hpp"

namespace {

using reco_bench::index_t;

// Compulsory bytes of one call: every input the preset reads, read once, and every gradient it
// writes, written once. Per token: logp and old_logp (4 B each), the mask (1 B), ref_logp with a
// KL term and entropy with an entropy-driven selector or clip (4 B each); written: the logp
// gradient (4 B) and the entropy gradient with an entropy bonus (4 B). Per response: the reward
// (4 B) and its offset into the packed tokens (8 B, R + 1 of them); per group: its offset (8 B,
// G + 1). Scratch the objective keeps in its workspace is not compulsory and is not counted.
struct traffic {
  struct range {
    const void* src;
    void* dst;  // null: read only
    std::size_t bytes;
  };
  std::vector<range> moves;  // src -> dst: the written bytes, each paired with an input of the same size
  double read = 0, written = 0;
  double total() const { return read + written; }
};

template <class T>
std::size_t nbytes(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

template <class Obj>
traffic compulsory_traffic(const reco_bench::token_batch& b, std::vector<float>& grad, std::vector<float>& grad_entropy) {
  traffic t;
  auto read = [&](const void* p, std::size_t n) {
    t.moves.push_back({p, nullptr, n});
    t.read += static_cast<double>(n);
  };
  // The logp gradient is written once: pair it with the logp read (memcpy logp -> gradient).
  t.moves.push_back({b.logp.data(), grad.data(), nbytes(b.logp)});
  t.read += static_cast<double>(nbytes(b.logp));
  t.written += static_cast<double>(nbytes(grad));
  read(b.old_logp.data(), nbytes(b.old_logp));
  read(b.mask.data(), nbytes(b.mask));
  if (Obj::needs_ref_logp) read(b.ref_logp.data(), nbytes(b.ref_logp));
  if (Obj::has_entropy_gradient) {
    t.moves.push_back({b.entropy.data(), grad_entropy.data(), nbytes(b.entropy)});
    t.read += static_cast<double>(nbytes(b.entropy));
    t.written += static_cast<double>(nbytes(grad_entropy));
  } else if (Obj::needs_entropy) {
    read(b.entropy.data(), nbytes(b.entropy));
  }
  if (Obj::needs_rewards) read(b.rewards.data(), nbytes(b.rewards));
  read(b.offsets.data(), nbytes(b.offsets));
  read(b.groups.data(), nbytes(b.groups));
  return t;
}

// The copy baseline: each thread takes an equal, 64-byte aligned share of every range. A written
// range is a memcpy src -> dst (reads and writes its bytes once). A read-only range is a memcpy
// into the thread's 16 KiB scratch, one L1-sized piece at a time: its bytes come from memory once
// and the scratch stays in L1, so no memory write is added. Every memcpy is at most 64 KiB, so
// glibc uses ordinary cached stores (as the objective does, write-allocate included), not the
// non-temporal stores it picks for copies of several MB.
constexpr std::size_t copy_piece = 64 << 10;
constexpr std::size_t scratch_bytes = 16 << 10;

// The OpenMP team size: the objective's passes (Thrust's OMP system) and the copy both use it.
inline int omp_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline void copy_share(const traffic::range& r, int thread, int threads, unsigned char* scratch) {
  const std::size_t lines = (r.bytes + 63) / 64;
  const std::size_t b = std::min(r.bytes, lines * thread / threads * 64);
  const std::size_t e = std::min(r.bytes, lines * (thread + 1) / threads * 64);
  const auto* src = static_cast<const unsigned char*>(r.src);
  if (r.dst) {
    auto* dst = static_cast<unsigned char*>(r.dst);
    for (std::size_t i = b; i < e; i += copy_piece) std::memcpy(dst + i, src + i, std::min(copy_piece, e - i));
  } else {
    for (std::size_t i = b; i < e; i += scratch_bytes) {
      std::memcpy(scratch, src + i, std::min(scratch_bytes, e - i));
      benchmark::ClobberMemory();  // the scratch is "read": keep every piece
    }
  }
}

inline void copy_pass(const traffic& t, std::vector<unsigned char>& scratch) {
#if defined(_OPENMP)
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
#else
  {
    const int threads = 1, thread = 0;
#endif
    unsigned char* mine = scratch.data() + static_cast<std::size_t>(thread) * scratch_bytes;
    for (const auto& r : t.moves) copy_share(r, thread, threads, mine);
  }
}

template <class Obj>
void bm_copy(benchmark::State& state) {
  const auto batch = reco_bench::make_token_batch(state.range(0));
  std::vector<float> grad(batch.grad.size()), grad_entropy(Obj::has_entropy_gradient ? batch.grad.size() : 0);
  const traffic t = compulsory_traffic<Obj>(batch, grad, grad_entropy);
  std::vector<unsigned char> scratch(static_cast<std::size_t>(omp_threads()) * scratch_bytes);
  benchmark::DoNotOptimize(scratch.data());
  for (auto _ : state) {
    copy_pass(t, scratch);
    benchmark::DoNotOptimize(grad.data());
    benchmark::ClobberMemory();
  }
  const double n = static_cast<double>(batch.N);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * t.total()));
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = n;
  state.counters["bytes"] = t.total();
  state.counters["threads"] = omp_threads();
}

// The backend's switch for the token diagnostics, where it has one (this file also builds
// against older headers, for before/after runs in one session).
template <class B, class = void>
struct has_diagnostics_switch : std::false_type {};
template <class B>
struct has_diagnostics_switch<B, std::void_t<decltype(std::declval<B&>().diagnostics)>> : std::true_type {};
template <class B>
void set_diagnostics(B& backend, bool on) {
  if constexpr (has_diagnostics_switch<B>::value) backend.diagnostics = on;
}

// The call's batch holds exactly the inputs its compulsory bytes count: ref_logp for a preset
// with a KL term, the entropies for one that reads them. Given the entropies anyway, a call with
// diagnostics would read them for the entropy mean: bytes the copy does not move.
template <class Preset, class T>
reco::batch_view<T> preset_inputs(reco::batch_view<T> v) {
  if (!Preset::needs_ref_logp) v.ref_logp = {};
  if (!Preset::needs_entropy && !Preset::has_entropy_gradient) v.entropy = {};
  return v;
}

// The benchmark batch in double (the same values widened).
struct double_batch {
  std::vector<double> logp, old_logp, ref_logp, entropy, rewards, grad;
  reco::batch_view<double> v;
  explicit double_batch(const reco_bench::token_batch& b)
      : logp(b.logp.begin(), b.logp.end()),
        old_logp(b.old_logp.begin(), b.old_logp.end()),
        ref_logp(b.ref_logp.begin(), b.ref_logp.end()),
        entropy(b.entropy.begin(), b.entropy.end()),
        rewards(b.rewards.begin(), b.rewards.end()),
        grad(b.grad.size()) {
    v.layout = reco::packed(reco::span<const index_t>(b.offsets));
    v.group_offsets = b.groups;
    v.logp = logp;
    v.old_logp = old_logp;
    v.ref_logp = ref_logp;
    v.entropy = entropy;
    v.mask = b.mask;
    v.rewards = rewards;
  }
};

// One call per iteration of `obj` (Preset's components, fixed or composed at run time), on the
// float batch or (T = double) its double copy. The bytes are the float batch's compulsory bytes
// either way.
template <class Preset, class T = float, class Obj>
void run_objective(benchmark::State& state, const Obj& obj, bool packed, bool diagnostics = true) {
  const auto batch = reco_bench::make_token_batch(state.range(0));
  auto grad = batch.grad;
  std::vector<float> grad_entropy(Preset::has_entropy_gradient ? batch.grad.size() : 0);
  const traffic t = compulsory_traffic<Preset>(batch, grad, grad_entropy);
  reco::workspace<reco::cpu> ws;
  reco::cpu backend;
  backend.vectorise = packed;
  set_diagnostics(backend, diagnostics);
  if constexpr (std::is_same_v<T, double>) {
    double_batch d(batch);
    std::vector<double> gd(grad.size()), ghd(grad_entropy.size());
    for (auto _ : state) {
      const auto r = obj(backend, preset_inputs<Preset>(d.v), reco::gradients<double>{gd, ghd}, ws);
      benchmark::DoNotOptimize(r.loss);
      benchmark::ClobberMemory();
    }
  } else {
    const auto view = preset_inputs<Preset>(batch.view());
    for (auto _ : state) {
      const auto r = obj(backend, view, reco::gradients<float>{grad, grad_entropy}, ws);
      benchmark::DoNotOptimize(r.loss);
      benchmark::ClobberMemory();
    }
  }
  const double n = static_cast<double>(batch.N);
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * t.total()));
  state.counters["tokens"] = n;
  state.counters["bytes"] = t.total();
  state.counters["threads"] = omp_threads();
}

template <class Obj, bool Packed>
void bm_objective(benchmark::State& state) {
  run_objective<Obj>(state, Obj{}, Packed);
}

// The packed pass of a call that asks for no token diagnostics (reco::cpu::diagnostics = false).
template <class Obj>
void bm_objective_no_diagnostics(benchmark::State& state) {
  run_objective<Obj>(state, Obj{}, true, false);
}

// The packed pass on double inputs.
template <class Obj>
void bm_objective_f64(benchmark::State& state) {
  run_objective<Obj, double>(state, Obj{}, true);
}

// The same preset as a composition (reco/composition.hpp): one compiled objective whose slots
// switch at run time, with the preset's components and constants. Against objective_cpu/<preset>
// in the same run, it prices the run-time choice (target: at most 1.3 times the preset's time).
template <class Preset>
void bm_composed(benchmark::State& state) {
  run_objective<Preset>(state, reco::composed_from(Preset{}), true);
}

#define RECO_OBJECTIVE_BENCH_PATH(preset, packed, path)                                           \
  BENCHMARK_TEMPLATE(bm_objective, reco::presets::preset, packed)                                 \
      ->Name("objective_cpu/" #preset "/" path)                                                   \
      ->Arg(8 << 10)                                                                              \
      ->Arg(256 << 10)                                                                            \
      ->Arg(4 << 20)                                                                              \
      ->Unit(benchmark::kMillisecond)                                                             \
      ->UseRealTime()
// 16M tokens on the default (packed) path and its copy baseline only: the scalar path at 16M
// would add seconds per repetition to a full run and says nothing the 4M row does not.
#define RECO_OBJECTIVE_BENCH(preset)                                                          \
  RECO_OBJECTIVE_BENCH_PATH(preset, true, "packed")->Arg(16 << 20);                           \
  RECO_OBJECTIVE_BENCH_PATH(preset, false, "scalar");                                         \
  BENCHMARK_TEMPLATE(bm_objective_no_diagnostics, reco::presets::preset)                      \
      ->Name("objective_cpu/" #preset "/packed_no_diagnostics")                               \
      ->Arg(4 << 20)                                                                          \
      ->Arg(16 << 20)                                                                         \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_objective_f64, reco::presets::preset)                                 \
      ->Name("objective_cpu/" #preset "/packed_f64")                                          \
      ->Arg(4 << 20)                                                                          \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_copy, reco::presets::preset)                                          \
      ->Name("copy_cpu/" #preset)                                                             \
      ->Arg(4 << 20)                                                                          \
      ->Arg(16 << 20)                                                                         \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_composed, reco::presets::preset)                                      \
      ->Name("composed_cpu/" #preset "/packed")                                               \
      ->Arg(8 << 10)                                                                          \
      ->Arg(256 << 10)                                                                        \
      ->Arg(4 << 20)                                                                          \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();

RECO_OBJECTIVE_BENCH(grpo)
RECO_OBJECTIVE_BENCH(reco)
RECO_OBJECTIVE_BENCH(dapo)
RECO_OBJECTIVE_BENCH(rule_80_20)

// The covariance selections (Clip-Cov, KL-Cov: selected on the host over the call's tokens) on
// the packed pass and against their copy, at 4M and 16M.
#define RECO_COVARIANCE_BENCH(preset)                                                         \
  BENCHMARK_TEMPLATE(bm_objective, reco::presets::preset, true)                               \
      ->Name("objective_cpu/" #preset "/packed")                                              \
      ->Arg(4 << 20)                                                                          \
      ->Arg(16 << 20)                                                                         \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_objective_no_diagnostics, reco::presets::preset)                      \
      ->Name("objective_cpu/" #preset "/packed_no_diagnostics")                               \
      ->Arg(4 << 20)                                                                          \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_objective_f64, reco::presets::preset)                                 \
      ->Name("objective_cpu/" #preset "/packed_f64")                                          \
      ->Arg(4 << 20)                                                                          \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();                                                                        \
  BENCHMARK_TEMPLATE(bm_copy, reco::presets::preset)                                          \
      ->Name("copy_cpu/" #preset)                                                             \
      ->Arg(4 << 20)                                                                          \
      ->Arg(16 << 20)                                                                         \
      ->Unit(benchmark::kMillisecond)                                                         \
      ->UseRealTime();

RECO_COVARIANCE_BENCH(clip_cov)
RECO_COVARIANCE_BENCH(kl_cov)

}  // namespace

int main(int argc, char** argv) {
#if RECO_SIMD
  benchmark::AddCustomContext("reco packed token pass",
                              std::string(reco::simd::active_isa()) + ", " +
                                  std::to_string(reco::simd::active_width()) + " doubles or " +
                                  std::to_string(2 * reco::simd::active_width()) + " floats per pack");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
