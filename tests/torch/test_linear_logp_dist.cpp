// Vocabulary-parallel reco::torch::linear_logp_entropy over 1, 2, 3 and 4 forked ranks (FileStore +
// ProcessGroupGloo on 127.0.0.1): each rank holds an uneven block of the lm_head's rows; logp,
// entropy and d loss / d hidden on every rank, and each rank's d loss / d weight and bias rows,
// equal the single-process call on the whole vocabulary (float64 and float32, masked rows, chunks
// of 3 tokens: several all-reduces per call). Every process runs under alarm().
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <ATen/ATen.h>

#include "forked_ranks.hpp"
#include "reco/torch/gloo_group.hpp"
#include "reco/torch/linear_logp_entropy.hpp"

namespace {

struct full_call {
  at::Tensor logp, entropy, dh, dw, db;
};

// The whole problem (the same on every rank: a fixed seed) and its unsharded result.
struct problem {
  at::Tensor h, w, b, tokens, mask, g, gh;
};
problem make_problem(at::ScalarType dt) {
  at::manual_seed(17);
  problem p;
  const int64_t N = 11, H = 6, V = 29;
  p.h = at::randn({N, H}, at::kDouble).to(dt);
  p.w = (at::randn({V, H}, at::kDouble) * 1.5).to(dt);
  p.b = at::randn({V}, at::kDouble).to(dt);
  p.tokens = at::randint(V, {N}, at::kLong);
  p.mask = at::ones({N}, at::kBool);
  p.mask[4] = false;
  p.g = at::randn({N}, at::kDouble);
  p.gh = at::randn({N}, at::kDouble);
  return p;
}

full_call run(const problem& p, const at::Tensor& w_part, const at::Tensor& b_part,
              const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  at::Tensor h = p.h.clone().requires_grad_(true), w = w_part.clone().requires_grad_(true),
             b = b_part.clone().requires_grad_(true);
  reco::torch::linear_logp_options o;
  o.temperature = 0.8;
  o.chunk_rows = 3;
  o.vocab_group = group;
  auto [logp, ent] = reco::torch::linear_logp_entropy(h, w, p.tokens, b, p.mask, o);
  ((logp.to(at::kDouble) * p.g).sum() + (ent.to(at::kDouble) * p.gh).sum()).backward();
  return {logp, ent, h.grad(), w.grad(), b.grad()};
}

// Uneven, non-empty blocks of V rows over `world` ranks.
std::vector<int64_t> block_starts(int64_t V, int world) {
  std::vector<int64_t> s{0};
  for (int q = 1; q < world; ++q) s.push_back(V * q * q / (world * world) + q);
  s.push_back(V);
  return s;
}

int run_rank(int rank, int world, const std::string& path) {
  auto store = c10::make_intrusive<c10d::FileStore>(path, world);
  auto group = reco::torch::loopback_gloo_group(store, rank, world, std::chrono::milliseconds(30000));
  int failures = 0;
  for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
    // The ranks sum the vocabulary in another order than the whole call: in float a gradient row,
    // a sum of V = 29 terms of magnitude up to ~3, may differ by V·u·Σ|terms| ≈ 2e-5.
    const double tol = dt == at::kDouble ? 1e-12 : 2e-5;
    const problem p = make_problem(dt);
    const full_call whole = run(p, p.w, p.b, c10::intrusive_ptr<c10d::ProcessGroup>());
    const auto starts = block_starts(p.w.size(0), world);
    const int64_t a = starts[static_cast<std::size_t>(rank)], z = starts[static_cast<std::size_t>(rank) + 1];
    const full_call part = run(p, p.w.slice(0, a, z), p.b.slice(0, a, z), group);
    auto expect_close = [&](const at::Tensor& x, const at::Tensor& y, const char* what) {
      if (!at::allclose(x.to(at::kDouble), y.to(at::kDouble), tol, tol)) {
        std::fprintf(stderr, "rank %d/%d %s %s: max difference %g\n", rank, world, c10::toString(dt), what,
                     (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>());
        ++failures;
      }
    };
    expect_close(part.logp, whole.logp, "logp");
    expect_close(part.entropy, whole.entropy, "entropy");
    expect_close(part.dh, whole.dh, "dh");
    expect_close(part.dw, whole.dw.slice(0, a, z), "dW");
    expect_close(part.db, whole.db.slice(0, a, z), "dbias");
  }
  return failures == 0 ? 0 : 1;
}

class VocabParallel : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallel, EqualsTheUnshardedCall) {
  const int world = GetParam();
  const std::vector<int> codes =
      torch_test::spawn(world, 120, [world](int rank, const std::string& path) { return run_rank(rank, world, path); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, VocabParallel, ::testing::Values(1, 2, 3, 4));

}  // namespace
