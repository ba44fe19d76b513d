// reco::torch::token_logp_entropy: against eager log_softmax + gather + entropy in float64,
// central finite differences, strided layouts, masked rows, -inf logits, half-precision logits
// against a float64 reference, and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>

#include <torch/csrc/autograd/autograd.h>

#include "reco/config.hpp"
#include "reco/torch/token_logp_entropy.hpp"

namespace {

const double neg_inf = -std::numeric_limits<double>::infinity();

// Eager composite (TRL/verl style) in float64: log_softmax, gather, and the entropy as
// -sum p log p with 0 log 0 = 0 (so that -inf logits give no NaN).
std::tuple<at::Tensor, at::Tensor> eager(const at::Tensor& logits, const at::Tensor& tokens, double temperature) {
  const at::Tensor ls = at::log_softmax(logits.to(at::kDouble) / temperature, -1);
  const at::Tensor logp = ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  const at::Tensor safe = at::where(at::isinf(ls), at::zeros_like(ls), ls);
  const at::Tensor entropy = -(ls.exp() * safe).sum(-1);
  return {logp, entropy};
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct problem {
  at::Tensor logits, tokens, mask, g_logp, g_entropy;
};

// [N, V] float64 logits with a few -inf entries (never a whole row, never the sampled token) and
// two masked rows; random upstream gradients for both outputs.
problem make_problem(int64_t N, int64_t V, uint64_t seed) {
  at::manual_seed(seed);
  problem p;
  p.logits = at::randn({N, V}, at::kDouble) * 3.0;
  p.tokens = at::randint(0, V, {N}, at::kLong);
  const at::Tensor holes = at::rand({N, V}, at::kDouble) < 0.15;
  holes.scatter_(1, p.tokens.unsqueeze(1), false);
  holes.select(1, (V - 1) / 2).fill_(false);  // every row keeps a finite logit
  p.logits.masked_fill_(holes, neg_inf);
  p.mask = at::ones({N}, at::kBool);
  p.mask[1] = false;
  p.mask[N - 2] = false;
  p.g_logp = at::randn({N}, at::kDouble);
  p.g_entropy = at::randn({N}, at::kDouble);
  return p;
}

TEST(TokenLogpEntropy, MatchesEagerInFloat64) {
  for (double temperature : {1.0, 0.7, 1.6}) {
    SCOPED_TRACE(temperature);
    problem p = make_problem(11, 41, 3);
    const at::Tensor x = p.logits.clone().requires_grad_(true);
    auto [logp, entropy] = reco::torch::token_logp_entropy(x, p.tokens, temperature, p.mask);
    ASSERT_EQ(logp.scalar_type(), at::kDouble);
    ASSERT_EQ(logp.sizes(), p.tokens.sizes());
    (logp * p.g_logp + entropy * p.g_entropy).sum().backward();

    const at::Tensor xr = p.logits.clone().requires_grad_(true);
    auto [rl, re] = eager(xr, p.tokens, temperature);
    const at::Tensor m = p.mask.to(at::kDouble);
    ((rl * p.g_logp + re * p.g_entropy) * m).sum().backward();

    EXPECT_LE(max_abs(logp * m, rl.detach() * m), 1e-12);
    EXPECT_LE(max_abs(entropy * m, re.detach() * m), 1e-12);
    EXPECT_LE(max_abs(x.grad(), xr.grad()), 1e-12);
    EXPECT_FALSE(at::isnan(x.grad()).any().item<bool>());
    // Masked rows: outputs 0, gradient exactly 0. -inf logits: gradient exactly 0.
    EXPECT_EQ(logp[1].item<double>(), 0.0);
    EXPECT_EQ(entropy[1].item<double>(), 0.0);
    EXPECT_EQ(x.grad()[1].abs().sum().item<double>(), 0.0);
    EXPECT_EQ(x.grad().masked_select(at::isinf(p.logits)).abs().sum().item<double>(), 0.0);
  }
}

// Central differences (h = 1e-6) of L = sum(g_logp * logp + g_H * H) in every finite logit.
TEST(TokenLogpEntropy, FiniteDifferences) {
  const double temperature = 0.8, h = 1e-6;
  problem p = make_problem(6, 9, 5);
  auto L = [&](const at::Tensor& logits) {
    auto [logp, entropy] = reco::torch::token_logp_entropy(logits, p.tokens, temperature, p.mask);
    return (logp * p.g_logp + entropy * p.g_entropy).sum();
  };
  const at::Tensor x = p.logits.clone().requires_grad_(true);
  L(x).backward();
  const at::Tensor analytic = x.grad();
  double worst = 0;
  int checked = 0;
  for (int64_t r = 0; r < p.logits.size(0); ++r)
    for (int64_t j = 0; j < p.logits.size(1); ++j) {
      if (std::isinf(p.logits[r][j].item<double>())) continue;
      at::Tensor up = p.logits.clone(), down = p.logits.clone();
      up[r][j] += h;
      down[r][j] -= h;
      const double fd = (L(up).item<double>() - L(down).item<double>()) / (2 * h);
      worst = std::max(worst, std::abs(fd - analytic[r][j].item<double>()));
      ++checked;
    }
  EXPECT_GT(checked, 30);
  EXPECT_LE(worst, 1e-8);
}

// [R, T, V] logits, including the strided slice logits[:, :-1, :] read without a copy, and [N, V]
// rows with padding between them: identical results to the contiguous tensor.
TEST(TokenLogpEntropy, StridedLayouts) {
  at::manual_seed(11);
  const int64_t R = 3, T = 5, V = 17;
  const at::Tensor full = (at::randn({R, T + 1, V}, at::kFloat) * 2).requires_grad_(true);
  const at::Tensor tokens = at::randint(0, V, {R, T}, at::kLong);
  const at::Tensor sliced = full.slice(1, 0, T);
  ASSERT_FALSE(sliced.is_contiguous());
  auto [lp, en] = reco::torch::token_logp_entropy(sliced, tokens, 0.9);
  ASSERT_EQ(lp.sizes(), tokens.sizes());
  (lp.sum() + 0.5 * en.sum()).backward();

  const at::Tensor dense = sliced.detach().contiguous().requires_grad_(true);
  auto [lp2, en2] = reco::torch::token_logp_entropy(dense, tokens, 0.9);
  (lp2.sum() + 0.5 * en2.sum()).backward();
  EXPECT_TRUE(at::equal(lp, lp2));
  EXPECT_TRUE(at::equal(en, en2));
  EXPECT_TRUE(at::equal(full.grad().slice(1, 0, T), dense.grad()));
  EXPECT_EQ(full.grad().select(1, T).abs().sum().item<float>(), 0.0f);

  // Rows with a gap: [N, V] view of [N, V + 5].
  const at::Tensor wide = at::randn({7, V + 5}, at::kFloat).requires_grad_(true);
  const at::Tensor rows = wide.narrow(1, 2, V);
  const at::Tensor tok = at::randint(0, V, {7}, at::kLong);
  auto [lp3, en3] = reco::torch::token_logp_entropy(rows, tok);
  auto [lp4, en4] = eager(rows.detach(), tok, 1.0);
  EXPECT_LE(max_abs(lp3, lp4), 2e-6);
  EXPECT_LE(max_abs(en3, en4), 2e-6);
  lp3.sum().backward();
  EXPECT_EQ(wide.grad().narrow(1, 0, 2).abs().sum().item<float>(), 0.0f);
}

// Only one output used: its gradient alone (the other's upstream gradient is zero).
TEST(TokenLogpEntropy, OneOutputUsed) {
  problem p = make_problem(8, 23, 13);
  for (int which = 0; which < 2; ++which) {
    const at::Tensor x = p.logits.clone().requires_grad_(true);
    auto outs = reco::torch::token_logp_entropy(x, p.tokens, 1.3);
    (which == 0 ? std::get<0>(outs) : std::get<1>(outs)).sum().backward();
    const at::Tensor xr = p.logits.clone().requires_grad_(true);
    auto ref = eager(xr, p.tokens, 1.3);
    (which == 0 ? std::get<0>(ref) : std::get<1>(ref)).sum().backward();
    EXPECT_LE(max_abs(x.grad(), xr.grad()), 1e-12) << which;
  }
}

// Masked rows are never read: NaN logits and an out-of-range token there change nothing.
TEST(TokenLogpEntropy, MaskedRowsAreNotRead) {
  problem p = make_problem(5, 12, 17);
  at::Tensor logits = p.logits.clone();
  logits[1].fill_(std::numeric_limits<double>::quiet_NaN());
  at::Tensor tokens = p.tokens.clone();
  tokens[1] = 999;
  const at::Tensor x = logits.requires_grad_(true);
  auto [lp, en] = reco::torch::token_logp_entropy(x, tokens, 1.0, p.mask.to(at::kByte));
  (lp.sum() + en.sum()).backward();
  EXPECT_FALSE(at::isnan(lp).any().item<bool>());
  EXPECT_FALSE(at::isnan(x.grad()).any().item<bool>());
  EXPECT_EQ(x.grad()[1].abs().sum().item<double>(), 0.0);
}

// Half-precision logits against a float64 reference on the same (rounded) values. Tolerances:
// the kernels accumulate in float32, so logp and the entropy agree to 2e-5 (1 + |value|) at
// V = 32,000; dlogits is rounded once to the storage type, so each entry agrees to 2^-7 of its
// own size (bf16: 8 significant bits) plus 1e-6 of the largest entry (fp16 subnormals below
// 6e-5 have an absolute step of 6e-8; float32 cancellation in the sampled token's entry).
TEST(TokenLogpEntropy, HalfPrecisionAgainstFloat64) {
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    at::manual_seed(19);
    const int64_t N = 48, V = 32000;
    const at::Tensor x = (at::randn({N, V}, at::kFloat) * 2).to(dt).requires_grad_(true);
    const at::Tensor tokens = at::randint(0, V, {N}, at::kLong);
    const at::Tensor g_l = at::randn({N}, at::kFloat), g_h = at::randn({N}, at::kFloat);
    auto [lp, en] = reco::torch::token_logp_entropy(x, tokens, 0.7);
    ASSERT_EQ(lp.scalar_type(), at::kFloat);
    (lp * g_l + en * g_h).sum().backward();
    ASSERT_EQ(x.grad().scalar_type(), dt);

    const at::Tensor xr = x.detach().to(at::kDouble).requires_grad_(true);
    auto [rl, re] = eager(xr, tokens, 0.7);
    (rl * g_l.to(at::kDouble) + re * g_h.to(at::kDouble)).sum().backward();
    EXPECT_LE(((lp.to(at::kDouble) - rl.detach()).abs() / (1 + rl.detach().abs())).max().item<double>(), 2e-5);
    EXPECT_LE(((en.to(at::kDouble) - re.detach()).abs() / (1 + re.detach().abs())).max().item<double>(), 2e-5);
    const at::Tensor err = (x.grad().to(at::kDouble) - xr.grad()).abs() - xr.grad().abs() / 128.0;
    EXPECT_LE(err.max().item<double>(), 1e-6 * xr.grad().abs().max().item<double>());
  }
}

TEST(TokenLogpEntropy, Float32AgainstFloat64) {
  problem p = make_problem(16, 3000, 23);
  const at::Tensor x = p.logits.to(at::kFloat).requires_grad_(true);
  auto [lp, en] = reco::torch::token_logp_entropy(x, p.tokens.to(at::kInt), 0.6);
  (lp * p.g_logp.to(at::kFloat) + en * p.g_entropy.to(at::kFloat)).sum().backward();
  const at::Tensor xr = x.detach().to(at::kDouble).requires_grad_(true);
  auto [rl, re] = eager(xr, p.tokens, 0.6);
  (rl * p.g_logp + re * p.g_entropy).sum().backward();
  EXPECT_LE(max_abs(lp, rl.detach()), 1e-4);
  EXPECT_LE(max_abs(en, re.detach()), 1e-4);
  EXPECT_LE(max_abs(x.grad(), xr.grad()), 1e-5);
}

std::string thrown_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const reco::error& e) {
    return e.argument();
  }
  return "";
}

TEST(TokenLogpEntropy, Errors) {
  const at::Tensor logits = at::randn({4, 10}, at::kFloat);
  const at::Tensor tokens = at::randint(0, 10, {4}, at::kLong);
  auto call = [](const at::Tensor& l, const at::Tensor& t, double tau = 1.0, const at::Tensor& m = {}) {
    return thrown_argument([&] { reco::torch::token_logp_entropy(l, t, tau, m); });
  };
  EXPECT_EQ(call(logits, tokens), "");
  EXPECT_EQ(call(logits.to(at::kLong), tokens), "logits");
  EXPECT_EQ(call(logits.reshape({40}), tokens), "logits");
  EXPECT_EQ(call(at::randn({10, 4}, at::kFloat).t(), tokens), "logits");  // vocabulary not contiguous
  EXPECT_EQ(call(logits, tokens.to(at::kFloat)), "tokens");
  EXPECT_EQ(call(logits, tokens.slice(0, 1)), "tokens");
  EXPECT_EQ(call(logits, at::full({4}, 10, at::kLong)), "tokens");  // out of range
  EXPECT_EQ(call(logits, tokens, 0.0), "temperature");
  EXPECT_EQ(call(logits, tokens, std::nan("")), "temperature");
  EXPECT_EQ(call(logits, tokens, 1.0, at::ones({4}, at::kFloat)), "row_mask");
  EXPECT_EQ(call(logits, tokens, 1.0, at::ones({3}, at::kBool)), "row_mask");
  at::Tensor dead = logits.clone();
  dead[2].fill_(-std::numeric_limits<float>::infinity());
  EXPECT_EQ(call(dead, tokens), "logits");  // an unmasked row with every logit -inf
  at::Tensor masked = at::ones({4}, at::kBool);
  masked[2] = false;
  EXPECT_EQ(call(dead, tokens, 1.0, masked), "");
}

}  // namespace
