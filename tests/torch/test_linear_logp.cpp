// reco::torch::linear_logp_entropy against LibTorch eager (h @ W.T + b, log_softmax, gather,
// entropy, autograd) in float64, float32 and bfloat16; [R, T, H] slices, a transposed weight,
// masked rows holding NaN, the upstream gradient of one output only, the last chunk's logits kept
// for the backward, errors naming the user's argument; and linear_policy_loss equal to policy_loss on eager logp and entropy.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <ATen/ATen.h>

#include "reco/torch/linear_logp_entropy.hpp"
#include "reco/torch/policy_loss.hpp"

namespace {

using reco::torch::linear_logp_entropy;

struct eager_out {
  at::Tensor logp, entropy;
};
// The materialising definition, in float64 on the given (possibly rounded) values.
eager_out eager(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, const at::Tensor& tokens, double tau) {
  at::Tensor x = at::matmul(h, w.t());
  if (b.defined()) x = x + b;
  const at::Tensor lp = at::log_softmax(x / tau, -1);
  return {lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1)};
}

struct leaves {
  at::Tensor h, w, b;
};
leaves make_leaves(int64_t N, int64_t H, int64_t V, at::ScalarType dt, std::uint64_t seed, bool bias = true) {
  at::manual_seed(static_cast<int64_t>(seed));
  leaves l;
  l.h = at::randn({N, H}, at::kDouble).to(dt);
  l.w = (at::randn({V, H}, at::kDouble) * (3.0 / std::sqrt(static_cast<double>(H)))).to(dt);
  if (bias) l.b = at::randn({V}, at::kDouble).to(dt);
  return l;
}

// Values and gradients of Σ g·logp + gH·entropy against eager in float64 on the same values.
void expect_matches_eager(at::ScalarType dt, double tol, double grad_tol) {
  const int64_t N = 13, H = 9, V = 37;
  const double tau = 0.7;
  leaves l = make_leaves(N, H, V, dt, 1);
  const at::Tensor tokens = at::randint(V, {N}, at::kLong);
  const at::Tensor g = at::randn({N}, at::kDouble), gh = at::randn({N}, at::kDouble);

  at::Tensor h = l.h.clone().requires_grad_(true), w = l.w.clone().requires_grad_(true), b = l.b.clone().requires_grad_(true);
  reco::torch::linear_logp_options o;
  o.temperature = tau;
  o.chunk_rows = 4;
  auto [logp, ent] = linear_logp_entropy(h, w, tokens, b, {}, o);
  EXPECT_EQ(logp.scalar_type(), dt == at::kDouble ? at::kDouble : at::kFloat);
  ((logp.to(at::kDouble) * g).sum() + (ent.to(at::kDouble) * gh).sum()).backward();

  at::Tensor he = l.h.to(at::kDouble).requires_grad_(true), we = l.w.to(at::kDouble).requires_grad_(true),
             be = l.b.to(at::kDouble).requires_grad_(true);
  const eager_out e = eager(he, we, be, tokens, tau);
  ((e.logp * g).sum() + (e.entropy * gh).sum()).backward();
  EXPECT_TRUE(at::allclose(logp.to(at::kDouble), e.logp, tol, tol));
  EXPECT_TRUE(at::allclose(ent.to(at::kDouble), e.entropy, tol, tol));
  EXPECT_EQ(h.grad().scalar_type(), dt);
  EXPECT_TRUE(at::allclose(h.grad().to(at::kDouble), he.grad(), grad_tol, grad_tol)) << (h.grad().to(at::kDouble) - he.grad()).abs().max();
  EXPECT_TRUE(at::allclose(w.grad().to(at::kDouble), we.grad(), grad_tol, grad_tol)) << (w.grad().to(at::kDouble) - we.grad()).abs().max();
  EXPECT_TRUE(at::allclose(b.grad().to(at::kDouble), be.grad(), grad_tol, grad_tol));
}

TEST(TorchLinearLogp, MatchesEagerFloat64) { expect_matches_eager(at::kDouble, 1e-12, 1e-11); }
TEST(TorchLinearLogp, MatchesEagerFloat32) { expect_matches_eager(at::kFloat, 2e-5, 2e-5); }
// bf16 gradients are rounded once to bf16 (2^-8 relative).
TEST(TorchLinearLogp, MatchesEagerBfloat16) { expect_matches_eager(at::kBFloat16, 2e-5, 1e-2); }

TEST(TorchLinearLogp, SlicedHiddenTransposedWeightMaskedRows) {
  const int64_t R = 3, T = 5, H = 6, V = 11;
  at::manual_seed(5);
  at::Tensor full = at::randn({R, T + 1, H}, at::kDouble);
  at::Tensor wt = at::randn({H, V}, at::kDouble);  // the weight is wt.t(): column-major
  at::Tensor mask = at::ones({R, T}, at::kBool);
  mask[1][2] = false;
  mask[2][4] = false;
  at::Tensor tokens = at::randint(V, {R, T}, at::kLong);
  tokens.masked_fill_(mask.logical_not(), -100);  // never read
  {
    at::NoGradGuard ng;
    full.select(1, 2).select(0, 1).fill_(std::numeric_limits<double>::quiet_NaN());  // the masked row [1][2]
    full.select(1, 4).select(0, 2).fill_(std::numeric_limits<double>::quiet_NaN());
  }
  full.requires_grad_(true);
  wt.requires_grad_(true);
  const at::Tensor h = full.slice(1, 0, T);  // [R, T, H], rows not evenly spaced
  auto [logp, ent] = linear_logp_entropy(h, wt.t(), tokens, {}, mask);
  ASSERT_EQ(logp.sizes(), (std::vector<int64_t>{R, T}));
  (logp.sum() + 0.5 * ent.sum()).backward();
  EXPECT_EQ(logp[1][2].item<double>(), 0.0);
  EXPECT_EQ(ent[2][4].item<double>(), 0.0);
  EXPECT_TRUE(full.grad().select(1, 2).select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(full.grad().select(1, T).eq(0).all().item<bool>());  // the sliced-off position
  EXPECT_FALSE(wt.grad().isnan().any().item<bool>());

  // Eager with the masked rows' NaN replaced by 0 (their loss terms are multiplied by 0).
  at::Tensor he = at::where(mask.unsqueeze(-1), full.detach().slice(1, 0, T), at::zeros({1}, at::kDouble))
                      .requires_grad_(true);
  at::Tensor we = wt.detach().clone().requires_grad_(true);
  const at::Tensor safe_tokens = tokens.clamp_min(0);
  eager_out e = eager(he, we.t(), {}, safe_tokens, 1.0);
  const at::Tensor m = mask.to(at::kDouble);
  ((e.logp * m).sum() + 0.5 * (e.entropy * m).sum()).backward();
  EXPECT_TRUE(at::allclose(logp, at::where(mask, e.logp, at::zeros_like(e.logp)), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(full.grad().slice(1, 0, T), he.grad(), 1e-11, 1e-11));
  EXPECT_TRUE(at::allclose(wt.grad(), we.grad(), 1e-11, 1e-11));
}

TEST(TorchLinearLogp, OneOutputsGradientOnlyAndNoBias) {
  leaves l = make_leaves(6, 5, 7, at::kDouble, 9, false);
  const at::Tensor tokens = at::randint(7, {6}, at::kLong);
  at::Tensor h = l.h.clone().requires_grad_(true), w = l.w.clone().requires_grad_(true);
  auto [logp, ent] = linear_logp_entropy(h, w, tokens);
  (void)ent;
  logp.sum().backward();  // the entropy's gradient undefined: skipped
  at::Tensor he = l.h.clone().requires_grad_(true), we = l.w.clone().requires_grad_(true);
  eager(he, we, {}, tokens, 1.0).logp.sum().backward();
  EXPECT_TRUE(at::allclose(h.grad(), he.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(w.grad(), we.grad(), 1e-12, 1e-12));
}

// The forward keeps its last chunk's logits for the backward (the CPU default): the same values
// and gradients as without, in one chunk and in several; a second backward (retain_graph) finds
// them taken and recomputes them.
TEST(TorchLinearLogp, KeptLastChunkGivesTheSameGradients) {
  const leaves l = make_leaves(11, 7, 29, at::kFloat, 4);
  const at::Tensor tokens = at::randint(29, {11}, at::kLong);
  const at::Tensor g = at::randn({11}), gh = at::randn({11});
  for (int64_t chunk : {0, 4}) {
    SCOPED_TRACE("chunk_rows=" + std::to_string(chunk));
    auto run = [&](bool keep, int backwards) {
      at::Tensor h = l.h.clone().requires_grad_(true), w = l.w.clone().requires_grad_(true),
                 b = l.b.clone().requires_grad_(true);
      reco::torch::linear_logp_options o;
      o.temperature = 0.8, o.chunk_rows = chunk, o.keep_last_chunk = keep;
      auto [logp, ent] = linear_logp_entropy(h, w, tokens, b, {}, o);
      const at::Tensor loss = (logp * g).sum() + (ent * gh).sum();
      for (int k = 0; k < backwards; ++k) loss.backward({}, /*retain_graph=*/true);
      return std::vector<at::Tensor>{logp.detach(), h.grad(), w.grad(), b.grad()};
    };
    const auto plain = run(false, 1), kept = run(true, 1), twice = run(true, 2);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(at::allclose(kept[i], plain[i], 1e-6, 1e-7)) << i << ": " << (kept[i] - plain[i]).abs().max();
      if (i == 0) continue;
      EXPECT_TRUE(at::allclose(twice[i], 2 * plain[i], 1e-6, 1e-7)) << i << ": " << (twice[i] - 2 * plain[i]).abs().max();
    }
  }
}

void expect_error(const std::function<void()>& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one naming " << argument;
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(TorchLinearLogp, ErrorsNameTheArgument) {
  leaves l = make_leaves(4, 3, 5, at::kFloat, 2);
  const at::Tensor tokens = at::randint(5, {4}, at::kLong);
  expect_error([&] { linear_logp_entropy(l.h, l.w.to(at::kDouble), tokens); }, "weight");
  expect_error([&] { linear_logp_entropy(l.h, at::randn({5, 4}), tokens); }, "weight");
  expect_error([&] { linear_logp_entropy(l.h.to(at::kInt), l.w.to(at::kInt), tokens); }, "hidden");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens.view({2, 2})); }, "tokens");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens + 5); }, "tokens");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens.to(at::kFloat)); }, "tokens");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens, at::randn({4})); }, "bias");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens, {}, at::ones({3}, at::kBool)); }, "row_mask");
  // Devices: every tensor on hidden's, which is the CPU or a CUDA device.
  expect_error([&] { linear_logp_entropy(l.h, l.w.to(at::kMeta), tokens); }, "weight");
  expect_error([&] { linear_logp_entropy(l.h.to(at::kMeta), l.w.to(at::kMeta), tokens); }, "hidden");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens.to(at::kMeta)); }, "tokens");
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens, at::zeros({5}, at::kMeta)); }, "bias");
  at::Tensor bad = l.h.clone();
  bad[1][2] = std::numeric_limits<float>::infinity();
  expect_error([&] { linear_logp_entropy(bad, l.w, tokens); }, "hidden");
  reco::torch::linear_logp_options o;
  o.temperature = -1;
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens, {}, {}, o); }, "temperature");
  o = {};
  o.memory_budget = 16;
  expect_error([&] { linear_logp_entropy(l.h, l.w, tokens, {}, {}, o); }, "memory_budget");
  // N = 0: empty outputs.
  auto [lp, en] = linear_logp_entropy(l.h.slice(0, 0, 0), l.w, tokens.slice(0, 0, 0));
  EXPECT_EQ(lp.numel(), 0);
  EXPECT_EQ(en.numel(), 0);
}

// Hidden states -> the "reco" preset's loss in one call, against policy_loss on eager values.
TEST(TorchLinearLogp, LinearPolicyLossEqualsPolicyLossOnEagerLogp) {
  const int64_t R = 4, T = 6, H = 5, V = 17;
  at::manual_seed(3);
  const at::Tensor h0 = at::randn({R, T, H}, at::kDouble), w0 = at::randn({V, H}, at::kDouble);
  const at::Tensor tokens = at::randint(V, {R, T}, at::kLong);
  at::Tensor mask = at::ones({R, T}, at::kBool);
  mask[0][5] = false;
  mask[3][4] = false;
  mask[3][5] = false;
  reco::torch::policy_inputs in;
  in.mask = mask;
  in.old_logp = -at::rand({R, T}, at::kDouble) * 3 - 0.1;
  const at::Tensor ref_logp = -at::rand({R, T}, at::kDouble) * 3 - 0.1;
  in.rewards = at::tensor({1.0, 0.0, 1.0, 1.0}, at::kDouble);
  in.group_offsets = at::tensor({0, 2, 4}, at::kLong);
  for (const std::string preset : {"reco", "dapo"}) {
    SCOPED_TRACE(preset);
    in.ref_logp = preset == "reco" ? ref_logp : at::Tensor();
    at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto out = reco::torch::linear_policy_loss(h, w, tokens, in, false, [&](const reco::torch::policy_inputs& x) {
      return reco::torch::policy_loss(preset, x);
    });
    out.loss.backward();
    at::Tensor he = h0.clone().requires_grad_(true), we = w0.clone().requires_grad_(true);
    reco::torch::policy_inputs ie = in;
    ie.logp = eager(he, we, {}, tokens, 1.0).logp;
    auto oe = reco::torch::policy_loss(preset, ie);
    oe.loss.backward();
    EXPECT_NEAR(out.loss.item<double>(), oe.loss.item<double>(), 1e-12);
    const at::Tensor m = mask.unsqueeze(-1).to(at::kDouble);
    EXPECT_TRUE(at::allclose(h.grad(), he.grad() * m, 1e-11, 1e-12));
    EXPECT_TRUE(at::allclose(w.grad(), we.grad(), 1e-11, 1e-12));
  }
}

}  // namespace
