// Peak extra memory of reco::logits::linear_forward / linear_backward, measured by a hook on the
// global operator new / delete of this binary: at N = 512, V = 32,001 the logits alone would
// take 66 MB in float; the calls stay within their 8 MiB budget plus O(N + H), also when the
// forward keeps its last chunk's logits for the backward (held between them, then reused).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "reco/logits/cblas_gemm.hpp"
#include "reco/logits/linear_logp_entropy.hpp"

namespace {
std::atomic<std::size_t> live{0}, peak{0};
std::atomic<bool> counting{false};

void* counted_alloc(std::size_t n) {
  // The size (0 when not counted) is stored in front of the block so that delete can subtract it.
  void* p = std::malloc(n + 16);
  if (!p) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = counting ? n : 0;
  if (counting) {
    const std::size_t now = live += n;
    std::size_t old = peak;
    while (now > old && !peak.compare_exchange_weak(old, now)) {
    }
  }
  return static_cast<char*>(p) + 16;
}
void counted_free(void* q) {
  if (!q) return;
  void* p = static_cast<char*>(q) - 16;
  live -= *static_cast<std::size_t*>(p);
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace {

namespace rl = reco::logits;
using reco::index_t;

template <class T>
void check_peak(bool keep) {
  using A = rl::accum_t<T>;
  const index_t N = 512, H = 16, V = 32001;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> h(N * H), w(V * H);
  for (auto& v : h) v = T(normal(rng));
  for (auto& v : w) v = T(0.5f * normal(rng));
  std::vector<std::int64_t> tokens(N);
  for (index_t r = 0; r < N; ++r) tokens[r] = (r * 7919) % V;
  std::vector<A> logp(N), ent(N), lse(N), g(N, A(1));
  std::vector<T> dh(N * H);
  std::vector<A> dw(V * H, A(0));
  rl::linear_operands<T> in;
  in.hidden = h.data(), in.rows = N, in.hidden_size = H, in.weight = w.data(), in.vocab = V, in.tokens = tokens.data();
  rl::linear_options o;
  o.memory_budget = std::size_t(8) << 20;
  const rl::linear_chunking plan = rl::linear_chunking_of(N, V, H, sizeof(A), !std::is_same_v<T, A>, o.memory_budget, 0);
  EXPECT_LT(plan.chunk_rows, N);  // the logits do not fit: several chunks
  EXPECT_LE(plan.workspace_bytes, o.memory_budget);

  rl::linear_kept_logits<A> kept;
  live = 0, peak = 0, counting = true;
  rl::linear_forward(rl::cblas_gemm{}, in, o,
                     rl::linear_outputs<A>{logp.data(), ent.data(), lse.data(), nullptr, keep ? &kept : nullptr});
  // Between the calls: nothing held but the kept tile (one chunk's logits, within the budget).
  const std::size_t kept_bytes = static_cast<std::size_t>(plan.chunk_rows) * V * sizeof(A);
  EXPECT_EQ(kept.bytes(), keep ? kept_bytes : 0u);
  EXPECT_LE(live.load(), (keep ? kept_bytes : 0u) + (std::size_t(8) << 10));
  rl::linear_gradients<T> gr;
  gr.grad_logp = g.data(), gr.grad_entropy = g.data(), gr.saved_lse = lse.data(), gr.saved_entropy = ent.data();
  gr.dhidden = dh.data(), gr.dweight = dw.data(), gr.kept = &kept;
  rl::linear_backward(rl::cblas_gemm{}, in, o, gr);
  counting = false;
  const std::size_t logits_bytes = static_cast<std::size_t>(N) * V * sizeof(A);
  // The budget, plus a few kB of O(1) (the OpenMP runtime's and the error strings' allocations).
  EXPECT_LE(peak.load(), o.memory_budget + (std::size_t(64) << 10)) << "logits would be " << logits_bytes;
  EXPECT_GT(peak.load(), plan.workspace_bytes / 2);  // the hook sees the workspace
  EXPECT_EQ(live.load(), 0u);
  for (index_t r = 0; r < N; ++r) ASSERT_TRUE(std::isfinite(logp[r]) && logp[r] <= 0) << r;
}

TEST(LinearLogpEntropyMemory, PeakWithinBudgetFloat) { check_peak<float>(false); }
TEST(LinearLogpEntropyMemory, PeakWithinBudgetBf16) { check_peak<reco::bf16_t>(false); }
TEST(LinearLogpEntropyMemory, PeakWithinBudgetKeptFloat) { check_peak<float>(true); }
TEST(LinearLogpEntropyMemory, PeakWithinBudgetKeptBf16) { check_peak<reco::bf16_t>(true); }

}  // namespace
