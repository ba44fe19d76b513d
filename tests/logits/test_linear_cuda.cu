// reco::logits::linear_forward_cuda / linear_backward_cuda (cuBLAS + the logits CUDA kernels)
// against the host call over OpenBLAS, in float, double and bf16, with a bias, masked rows holding
// NaN and several chunks. Without a CUDA device every test skips ("no CUDA device"); the host-side
// planning is tested in test_linear_logp_entropy.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reco/logits/cblas_gemm.hpp"
#include "reco/logits/linear_logp_entropy.cuh"

namespace {

namespace rl = reco::logits;
using reco::index_t;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class X>
X* to_device(const std::vector<X>& v) {
  X* p = nullptr;
  reco::detail::cuda_check(cudaMalloc(&p, std::max<std::size_t>(v.size(), 1) * sizeof(X)), "cudaMalloc");
  reco::detail::cuda_check(cudaMemcpy(p, v.data(), v.size() * sizeof(X), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}
template <class X>
std::vector<X> to_host(const X* p, std::size_t n) {
  std::vector<X> v(n);
  reco::detail::cuda_check(cudaMemcpy(v.data(), p, n * sizeof(X), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return v;
}

template <class T>
void parity(double tol) {
  using A = rl::accum_t<T>;
  const index_t N = 37, H = 19, V = 1001;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> h(N * H), w(V * H), b(V);
  for (auto& v : h) v = T(normal(rng));
  for (auto& v : w) v = T(0.7f * normal(rng));
  for (auto& v : b) v = T(normal(rng));
  std::vector<std::int64_t> tokens(N);
  std::vector<std::uint8_t> mask(N, 1);
  for (index_t r = 0; r < N; ++r) tokens[r] = (r * 7919) % V;
  for (index_t r = 3; r < N; r += 7) {
    mask[r] = 0, tokens[r] = -1;
    for (index_t k = 0; k < H; ++k) h[r * H + k] = T(std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<A> g(N), ge(N);
  for (index_t r = 0; r < N; ++r) g[r] = A(0.1 * (r % 5) - 0.2), ge[r] = A(0.05 * (r % 3) - 0.05);
  rl::linear_options o;
  o.temperature = 0.8;

  // Host.
  rl::linear_operands<T> in;
  in.hidden = h.data(), in.rows = N, in.hidden_size = H, in.weight = w.data(), in.vocab = V, in.bias = b.data();
  in.tokens = tokens.data(), in.row_mask = mask.data();
  std::vector<A> logp(N), ent(N), lse(N), dw(V * H, A(0)), db(V, A(0));
  std::vector<T> dh(N * H);
  rl::linear_forward(rl::cblas_gemm{}, in, o, rl::linear_outputs<A>{logp.data(), ent.data(), lse.data()});
  rl::linear_gradients<T> gr;
  gr.grad_logp = g.data(), gr.grad_entropy = ge.data(), gr.saved_lse = lse.data(), gr.saved_entropy = ent.data();
  gr.dhidden = dh.data(), gr.dweight = dw.data(), gr.dbias = db.data();
  rl::linear_backward(rl::cblas_gemm{}, in, o, gr);

  // Device, 8 rows per chunk.
  auto din = in;
  din.hidden = to_device(h), din.weight = to_device(w), din.bias = to_device(b);
  din.tokens = to_device(tokens), din.row_mask = to_device(mask);
  A *d_logp = to_device(std::vector<A>(N)), *d_ent = to_device(std::vector<A>(N)), *d_lse = to_device(std::vector<A>(N));
  A *d_dw = to_device(std::vector<A>(V * H, A(0))), *d_db = to_device(std::vector<A>(V, A(0)));
  const A *d_g = to_device(g), *d_ge = to_device(ge);
  T* d_dh = to_device(std::vector<T>(N * H));
  const auto plan = rl::linear_cuda_chunking_of(N, V, H, sizeof(T), sizeof(A), o.memory_budget, 8);
  void* ws = nullptr;
  reco::detail::cuda_check(cudaMalloc(&ws, plan.workspace_bytes), "cudaMalloc");
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  rl::linear_forward_cuda(handle, din, o, rl::linear_outputs<A>{d_logp, d_ent, d_lse}, ws, plan, nullptr);
  rl::linear_gradients<T> dg;
  dg.grad_logp = d_g, dg.grad_entropy = d_ge, dg.saved_lse = d_lse, dg.saved_entropy = d_ent;
  dg.dhidden = d_dh, dg.dweight = d_dw, dg.dbias = d_db;
  rl::linear_backward_cuda(handle, din, o, dg, ws, plan, nullptr);
  reco::detail::cuda_check(cudaDeviceSynchronize(), "sync");
  const auto c_logp = to_host(d_logp, N), c_ent = to_host(d_ent, N);
  const auto c_dw = to_host(d_dw, V * H);
  const auto c_dh = to_host(d_dh, N * H);
  for (index_t r = 0; r < N; ++r) {
    EXPECT_NEAR(c_logp[r], logp[r], tol * (1 + std::fabs(logp[r]))) << r;
    EXPECT_NEAR(c_ent[r], ent[r], tol * (1 + ent[r])) << r;
  }
  for (index_t i = 0; i < N * H; ++i)
    EXPECT_NEAR(static_cast<double>(static_cast<float>(c_dh[i])), static_cast<double>(static_cast<float>(dh[i])),
                (std::is_same_v<T, reco::bf16_t> ? 1e-2 : tol) * (1e-2 + std::fabs(static_cast<float>(dh[i]))));
  for (index_t i = 0; i < V * H; ++i)
    EXPECT_NEAR(c_dw[i], dw[i], (std::is_same_v<T, reco::bf16_t> ? 1e-2 : tol) * (1e-2 + std::fabs(dw[i])));
  cublasDestroy(handle);
  cudaFree(ws);
}

TEST(LinearLogpEntropyCuda, FloatMatchesHost) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  parity<float>(1e-4);  // cuBLAS may use TF32-free fp32 paths in another order than OpenBLAS
}
TEST(LinearLogpEntropyCuda, DoubleMatchesHost) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  parity<double>(1e-11);
}
TEST(LinearLogpEntropyCuda, Bf16MatchesHost) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  parity<reco::bf16_t>(1e-4);  // dlogits rounded once to bf16 on the device for the backward GEMMs
}

}  // namespace
