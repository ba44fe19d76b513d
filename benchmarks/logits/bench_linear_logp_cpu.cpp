// CPU benchmark of reco::logits::linear_* (logp and entropy from hidden states, OpenBLAS GEMMs)
// against, in the same binary and run: the three GEMMs a materialising implementation needs
// alone (logits = h W^T, dh = dX W, dW = dX^T h; the floor), and LibTorch eager (h @ W.T,
// log_softmax, gather, entropy, autograd backward). fp32, temperature 0.7, arguments N, H, V and
// the thread count (OpenMP, OpenBLAS and LibTorch's intra-op pool set alike).
//   reco fwd+bwd  forward, then backward from the saved lse and entropy (4 GEMMs)
//   reco fused    linear_fused with a token-local GRPO gradient (3 GEMMs: no recompute)
//   reco grpo / reco reco   reco::linear_policy_loss with the grpo / reco preset on a batch of
//                 responses of 512 tokens in groups of 4, off-policy: the objective folded into
//                 the chunk pass (3 GEMMs, the objective called once per chunk)
// Counter peak_extra_MB: the rise of the process's peak resident memory over its resident memory
// before the iteration (/proc/self/clear_refs resets the peak), inputs and outputs excluded.
#include <benchmark/benchmark.h>

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "reco/backend/cpu.hpp"
#include "reco/logits/cblas_gemm.hpp"
#include "reco/logits/linear_logp_entropy.hpp"
#include "reco/logits/linear_policy_loss.hpp"
#include "reco/presets.hpp"

namespace {

namespace rl = reco::logits;
using reco::index_t;

long resident_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
  return 0;
}
// Peak resident memory since the reset, minus resident memory at the reset, in MB.
struct peak_meter {
  long base_kb = 0;
  void reset() {
    std::ofstream("/proc/self/clear_refs") << "5";
    base_kb = resident_kb("VmRSS:");
  }
  double extra_mb() const { return static_cast<double>(resident_kb("VmHWM:") - base_kb) / 1024.0; }
};

void set_threads(int t) {
  omp_set_num_threads(t);
  openblas_set_num_threads(t);
  at::set_num_threads(t);
}

struct problem {
  index_t N, H, V;
  at::Tensor h, w, tokens;  // h [N, H], w [V, H] fp32; the data of the reco calls too
  std::vector<float> logp, entropy, lse, g_logp, g_entropy, dh, dw;
  problem(index_t n, index_t hs, index_t v) : N(n), H(hs), V(v) {
    at::manual_seed(1);
    h = at::randn({N, H});
    w = at::randn({V, H}) * (3.0 / std::sqrt(static_cast<double>(H)));
    tokens = at::randint(V, {N}, at::kLong);
    logp.resize(N), entropy.resize(N), lse.resize(N), g_logp.assign(N, 1.0f / N), g_entropy.assign(N, -0.01f / N);
    dh.resize(N * H), dw.resize(V * H);
  }
  rl::linear_operands<float> operands() const {
    rl::linear_operands<float> in;
    in.hidden = h.data_ptr<float>(), in.rows = N, in.hidden_size = H;
    in.weight = w.data_ptr<float>(), in.vocab = V, in.tokens = tokens.data_ptr<std::int64_t>();
    return in;
  }
};

void set_counters(benchmark::State& state, const problem& p, double peak_mb) {
  state.counters["threads"] = static_cast<double>(state.range(3));
  state.counters["peak_extra_MB"] = peak_mb;
  state.counters["GEMM_GFLOP"] = 3 * 2.0 * static_cast<double>(p.N) * static_cast<double>(p.V) * static_cast<double>(p.H) / 1e9;
}

// Runs body() once per iteration, then sets the counters with the peak extra memory of the last
// iteration (plus held_mb, a buffer the variant holds throughout).
template <class Body>
void measure(benchmark::State& state, const problem& p, Body body, double held_mb = 0) {
  peak_meter meter;
  double peak = 0;
  for (auto _ : state) {
    meter.reset();
    body();
    peak = meter.extra_mb() + held_mb;
  }
  set_counters(state, p, peak);
}

// The three GEMMs of a materialising forward + backward, alone (dX is the logits' buffer).
void BM_gemms_alone(benchmark::State& state) {
  problem p(state.range(0), state.range(1), state.range(2));
  set_threads(static_cast<int>(state.range(3)));
  std::vector<float> x(static_cast<std::size_t>(p.N * p.V));
  const float* h = p.h.data_ptr<float>();
  const float* w = p.w.data_ptr<float>();
  const int N = static_cast<int>(p.N), H = static_cast<int>(p.H), V = static_cast<int>(p.V);
  measure(state, p, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, H, 1.0f, h, H, w, H, 0.0f, x.data(), V);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, H, V, 1.0f, x.data(), V, w, H, 0.0f, p.dh.data(), H);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, N, 1.0f, x.data(), V, h, H, 0.0f, p.dw.data(), H);
    benchmark::DoNotOptimize(p.dw.data());
  }, static_cast<double>(x.size()) * 4 / 1048576.0);  // the logits buffer, held throughout
}

// Forward, then backward; the forward keeps its last chunk's logits for the backward (as the
// LibTorch adapter does), so the backward recomputes every chunk but that one.
void BM_reco_fwd_bwd(benchmark::State& state) {
  problem p(state.range(0), state.range(1), state.range(2));
  set_threads(static_cast<int>(state.range(3)));
  rl::linear_options o;
  o.temperature = 0.7;
  measure(state, p, [&] {
    rl::linear_kept_logits<float> kept;
    rl::linear_forward(rl::cblas_gemm{}, p.operands(), o,
                       rl::linear_outputs<float>{p.logp.data(), p.entropy.data(), p.lse.data(), nullptr, &kept});
    rl::linear_gradients<float> g;
    g.kept = &kept;
    g.grad_logp = p.g_logp.data(), g.grad_entropy = p.g_entropy.data();
    g.saved_lse = p.lse.data(), g.saved_entropy = p.entropy.data();
    g.dhidden = p.dh.data(), g.dweight = p.dw.data();
    rl::linear_backward(rl::cblas_gemm{}, p.operands(), o, g);
    benchmark::DoNotOptimize(p.dw.data());
  });
}

// Token-local GRPO: loss = -Σ A_r min(ρ_r, clip(ρ_r)) / N with ρ = e^{logp - old}, on-policy
// old = logp (ρ = 1, the first PPO epoch), and an entropy bonus of 0.01.
void BM_reco_fused(benchmark::State& state) {
  problem p(state.range(0), state.range(1), state.range(2));
  set_threads(static_cast<int>(state.range(3)));
  rl::linear_options o;
  o.temperature = 0.7;
  std::vector<float> adv(static_cast<std::size_t>(p.N));
  for (index_t r = 0; r < p.N; ++r) adv[r] = (r % 3) - 1.0f;
  const float inv_n = 1.0f / static_cast<float>(p.N);
  measure(state, p, [&] {
    rl::linear_gradients<float> g;
    g.dhidden = p.dh.data(), g.dweight = p.dw.data();
    rl::linear_fused(rl::cblas_gemm{}, p.operands(), o, rl::linear_outputs<float>{p.logp.data(), p.entropy.data()}, g,
                     [&](const index_t* rows, index_t n, const float* lp, const float*, float* gl, float* ge) {
                       (void)lp;  // on-policy: ρ = 1 and unclipped, dL/dlogp = -A ρ / N
                       for (index_t i = 0; i < n; ++i) {
                         gl[i] = -adv[rows[i]] * inv_n;
                         ge[i] = -0.01f * inv_n;
                       }
                     });
    benchmark::DoNotOptimize(p.dw.data());
  });
}

// reco::linear_policy_loss with preset P: R = N / 512 responses in groups of 4, rewards 0/1,
// old_logp and ref_logp the current logp plus a deterministic offset in [-0.2, 0.2] (computed
// once, outside the timing), so that some ratios clip.
template <class P>
void BM_reco_policy_loss(benchmark::State& state) {
  problem p(state.range(0), state.range(1), state.range(2));
  set_threads(static_cast<int>(state.range(3)));
  rl::linear_options o;
  o.temperature = 0.7;
  rl::linear_forward(rl::cblas_gemm{}, p.operands(), o, rl::linear_outputs<float>{p.logp.data()});
  const index_t T = 512, R = std::max<index_t>(1, p.N / T);
  std::vector<float> old(static_cast<std::size_t>(p.N)), rewards(static_cast<std::size_t>(R));
  std::vector<index_t> groups;
  for (index_t t = 0; t < p.N; ++t) old[t] = p.logp[t] + 0.2f * static_cast<float>((t * 7919) % 201 - 100) / 100.0f;
  for (index_t i = 0; i < R; ++i) rewards[i] = static_cast<float>((i * 5) % 3 == 0);
  for (index_t g = 0; g <= R; g += 4) groups.push_back(g);
  if (groups.back() != R) groups.push_back(R);
  const P obj;
  reco::batch_view<float> b;
  b.layout = reco::padded(R, p.N / R);
  b.group_offsets = groups;
  b.old_logp = old;
  b.ref_logp = old;
  b.rewards = rewards;
  reco::workspace<reco::cpu> ws;
  measure(state, p, [&] {
    rl::linear_gradients<float> g;
    g.dhidden = p.dh.data(), g.dweight = p.dw.data();
    const reco::objective_result r = reco::linear_policy_loss(obj, reco::cpu{}, rl::cblas_gemm{}, p.operands(), o, b, g, ws);
    benchmark::DoNotOptimize(r.loss);
    benchmark::DoNotOptimize(p.dw.data());
  });
}

void BM_torch_eager(benchmark::State& state) {
  problem p(state.range(0), state.range(1), state.range(2));
  set_threads(static_cast<int>(state.range(3)));
  const at::Tensor g_logp = at::full({p.N}, 1.0f / p.N), g_entropy = at::full({p.N}, -0.01f / p.N);
  measure(state, p, [&] {
    at::Tensor h = p.h.detach().requires_grad_(true), w = p.w.detach().requires_grad_(true);
    const at::Tensor lp = at::log_softmax(at::matmul(h, w.t()) / 0.7, -1);
    const at::Tensor logp = lp.gather(-1, p.tokens.unsqueeze(-1)).squeeze(-1);
    const at::Tensor entropy = -(lp.exp() * lp).sum(-1);
    ((logp * g_logp).sum() + (entropy * g_entropy).sum()).backward();
    benchmark::DoNotOptimize(w.grad().data_ptr());
  });
}

// N, H, V, threads. The subset that runs in reasonable time on a 2-core machine (docs/benchmarks.md).
void shapes(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2}) {
    b->Args({1024, 896, 32000, t});
    b->Args({1024, 896, 151936, t});
    b->Args({1024, 2048, 32000, t});
    b->Args({8192, 896, 32000, t});
  }
  // Process CPU time next to the wall time: on a shared machine the CPU seconds of the work are
  // the steadier measure (run with --benchmark_enable_random_interleaving=true so that the
  // variants of a shape meet the same load).
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime()->Iterations(1);
}

BENCHMARK(BM_gemms_alone)->Apply(shapes);
BENCHMARK(BM_reco_fwd_bwd)->Apply(shapes);
BENCHMARK(BM_reco_fused)->Apply(shapes);
BENCHMARK(BM_reco_policy_loss<reco::presets::grpo>)->Name("BM_reco_grpo")->Apply(shapes);
BENCHMARK(BM_reco_policy_loss<reco::presets::reco>)->Name("BM_reco_reco")->Apply(shapes);
BENCHMARK(BM_torch_eager)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
