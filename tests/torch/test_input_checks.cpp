// Inputs the adapter used to ignore or pass to LibTorch unchecked: inputs a preset does not read,
// the values of accepted-but-unused inputs, sparse tensors, a float32 loss that overflows, +inf
// logits and tiny temperatures, and the memory of the logits backward for transposed logits.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <torch/csrc/autograd/autograd.h>

#include "reco/reco.hpp"
#include "reco/torch/policy_loss.hpp"
#include "reco/torch/token_logp_entropy.hpp"
#include "torch/test_batches.hpp"

namespace {

using reco::torch::policy_inputs;

const double nan_value = std::numeric_limits<double>::quiet_NaN();
const double inf_value = std::numeric_limits<double>::infinity();

// The argument of the reco::error that f throws, "" when it throws none, and "<other: ...>" for
// any other exception (LibTorch's own messages, which name no argument).
std::string thrown(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const reco::error& e) {
    EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos) << "the message must name the argument";
    if (message) *message = e.what();
    return e.argument();
  } catch (const std::exception& e) {
    return std::string("<other: ") + e.what() + ">";
  }
  return "";
}

struct InputChecks : ::testing::Test {
  torch_test::batch padded = torch_test::make_batch(5, false, 4, 6);

  std::string run(const std::string& preset, const std::function<void(policy_inputs&)>& edit,
                  std::string* message = nullptr, const std::map<std::string, double>& overrides = {}) {
    policy_inputs in = torch_test::inputs(padded, at::kFloat);
    edit(in);
    return thrown([&] { reco::torch::policy_loss(preset, in, overrides); }, message);
  }

  // A valid token of the padded batch, and a masked one.
  std::pair<int64_t, int64_t> token(bool valid) const {
    const at::Tensor idx = (valid ? padded.mask : padded.mask.logical_not()).reshape({-1}).nonzero();
    const int64_t flat = idx[0][0].item<int64_t>();
    return {flat / padded.T, flat % padded.T};
  }
};

TEST_F(InputChecks, InputsThePresetDoesNotReadAreErrors) {
  std::string msg;
  // Advantages given to presets that compute them from rewards: finite or NaN, an error either way.
  EXPECT_EQ(run("dapo", [&](policy_inputs& in) { in.advantages = at::ones({padded.R}, at::kFloat); }, &msg),
            "advantages");
  EXPECT_NE(msg.find("preset 'dapo' computes advantages from rewards"), std::string::npos) << msg;
  EXPECT_EQ(run("grpo", [&](policy_inputs& in) { in.advantages = at::full({padded.R}, nan_value, at::kFloat); }),
            "advantages");
  // Response weights to presets without reco::caller_weight.
  EXPECT_EQ(run("grpo", [&](policy_inputs& in) { in.response_weights = at::full({padded.R}, nan_value, at::kFloat); },
                &msg),
            "response_weights");
  EXPECT_NE(msg.find("preset 'grpo'"), std::string::npos) << msg;
  EXPECT_EQ(run("reco", [&](policy_inputs& in) { in.response_weights = at::ones({padded.R}, at::kFloat); }),
            "response_weights");

  // A custom objective reading given advantages does not read rewards, and needs advantages.
  using given_t = reco::objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                  reco::token_mean>;
  policy_inputs in = torch_test::inputs(padded, at::kFloat);
  in.advantages = at::randn({padded.R}, at::kFloat);
  EXPECT_EQ(thrown([&] { reco::torch::policy_loss(given_t{}, in); }, &msg), "rewards");
  EXPECT_NE(msg.find("this objective"), std::string::npos) << msg;
  in.rewards = at::Tensor();
  EXPECT_EQ(thrown([&] { reco::torch::policy_loss(given_t{}, in); }), "");
  in.advantages = at::Tensor();
  EXPECT_EQ(thrown([&] { reco::torch::policy_loss(given_t{}, in); }), "advantages");
}

// Entropy is accepted by every preset (it feeds the entropy diagnostics) and ref_logp by presets
// without a KL term (one call site for every preset); their values are checked in valid tokens.
TEST_F(InputChecks, AcceptedUnusedInputsAreChecked) {
  policy_inputs in = torch_test::inputs(padded, at::kDouble);
  const reco::torch::policy_output out = reco::torch::policy_loss("grpo", in);
  const at::Tensor m = padded.mask.to(at::kDouble);
  const double want_mean = (padded.entropy * m).sum().item<double>() / m.sum().item<double>();
  EXPECT_NEAR(out.stats.stats.entropy_mean, want_mean, 1e-12);

  const auto [r, t] = token(true);
  const auto [rm, tm] = token(false);
  std::string msg;
  for (const char* preset : {"grpo", "dapo", "reco"}) {
    SCOPED_TRACE(preset);
    EXPECT_EQ(run(preset, [&, r = r, t = t](policy_inputs& in) { in.entropy = in.entropy.clone(); in.entropy[r][t] = nan_value; },
                  &msg),
              "entropy");
    EXPECT_NE(msg.find("[" + std::to_string(r) + ", " + std::to_string(t) + "]"), std::string::npos) << msg;
    EXPECT_EQ(run(preset, [&, r = r, t = t](policy_inputs& in) { in.entropy = in.entropy.clone(); in.entropy[r][t] = inf_value; }),
              "entropy");
    // A masked token is not read.
    EXPECT_EQ(run(preset, [&, rm = rm, tm = tm](policy_inputs& in) { in.entropy = in.entropy.clone(); in.entropy[rm][tm] = nan_value; }),
              "");
  }
  // dapo has no KL term: ref_logp is accepted, its values checked.
  EXPECT_EQ(run("dapo", [&, r = r, t = t](policy_inputs& in) { in.ref_logp = in.ref_logp.clone(); in.ref_logp[r][t] = nan_value; }),
            "ref_logp");
  EXPECT_EQ(run("dapo", [&, rm = rm, tm = tm](policy_inputs& in) { in.ref_logp = in.ref_logp.clone(); in.ref_logp[rm][tm] = nan_value; }),
            "");
  // Where the objective reads them, the core's own checks report them (unchanged).
  EXPECT_EQ(run("rule_80_20", [&, r = r, t = t](policy_inputs& in) { in.entropy = in.entropy.clone(); in.entropy[r][t] = nan_value; }),
            "batch.entropy");
  EXPECT_EQ(run("grpo", [&, r = r, t = t](policy_inputs& in) { in.ref_logp = in.ref_logp.clone(); in.ref_logp[r][t] = nan_value; }),
            "batch.ref_logp");
}

TEST_F(InputChecks, SparseTensorsAreNamed) {
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = in.logp.detach().to_sparse(); }), "logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.old_logp = in.old_logp.to_sparse(); }), "old_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.ref_logp = in.ref_logp.to_sparse(); }), "ref_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.entropy = in.entropy.to_sparse(); }), "entropy");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.mask = in.mask.to_sparse(); }), "mask");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = in.rewards.to_sparse(); }), "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.group_offsets = in.group_offsets.to_sparse(); }), "group_offsets");
  EXPECT_EQ(run("grpo",
                [&](policy_inputs& in) {
                  in.group_offsets = at::Tensor();
                  in.prompt_ids = at::tensor(padded.prompt_ids, at::kLong).to_sparse();
                }),
            "prompt_ids");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.token_weights = at::ones_like(in.old_logp).to_sparse(); }),
            "token_weights");
  std::string msg;
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = in.logp.detach().to_sparse(); }, &msg), "logp");
  EXPECT_NE(msg.find("dense (strided)"), std::string::npos) << msg;

  const at::Tensor logits = at::randn({4, 10}, at::kFloat);
  const at::Tensor tokens = at::randint(0, 10, {4}, at::kLong);
  EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(logits.to_sparse(), tokens); }), "logits");
  EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(logits, tokens.to_sparse()); }), "tokens");
  EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(logits, tokens, 1.0, at::ones({4}, at::kBool).to_sparse()); }),
            "row_mask");
}

// An old policy far below the current one with the weight cap off: in float64 the loss is huge
// but exact; in float32 it cannot be represented, which is an error naming logp.
TEST_F(InputChecks, WeightCapOffFarOffPolicy) {
  // The first response of a group with unequal rewards that has valid tokens.
  int64_t far = -1;
  for (size_t g = 0; g + 1 < padded.group_offsets.size() && far < 0; ++g) {
    const int64_t b = padded.group_offsets[g], e = padded.group_offsets[g + 1];
    const at::Tensor rw = padded.rewards.slice(0, b, e);
    if (rw.max().item<double>() == rw.min().item<double>()) continue;
    for (int64_t i = b; i < e; ++i)
      if (padded.mask[i].any().item<bool>()) {
        far = i;
        break;
      }
  }
  ASSERT_GE(far, 0);
  for (const double cap : {0.0, inf_value}) {
    SCOPED_TRACE(cap);
    const std::map<std::string, double> no_cap{{"weight.cap", cap}};
    policy_inputs in = torch_test::inputs(padded, at::kFloat);
    in.old_logp = in.old_logp.clone();
    in.old_logp[far].fill_(-100.0);
    std::string msg;
    EXPECT_EQ(thrown([&] { reco::torch::policy_loss("reco", in, no_cap); }, &msg), "logp");
    EXPECT_NE(msg.find("float32"), std::string::npos) << msg;

    // float64: the loss and gradient of the plain-LibTorch reference without a cap.
    policy_inputs d = torch_test::inputs(padded, at::kDouble);
    d.old_logp = d.old_logp.clone();
    d.old_logp[far].fill_(-100.0);
    const reco::torch::policy_output out = reco::torch::policy_loss("reco", d, no_cap);
    out.loss.backward();
    const at::Tensor ref_logp = d.logp.detach().clone().requires_grad_(true);
    torch_test::batch b = padded;
    b.old_logp = d.old_logp;
    const torch_ref::result ref =
        torch_ref::loss(torch_ref::preset("reco_no_cap"), torch_test::padded_view(b, d, ref_logp));
    ref.loss.backward();
    const double want = ref.loss.item<double>();
    ASSERT_TRUE(std::isfinite(want));
    EXPECT_GT(std::fabs(want), 1e38);
    EXPECT_NEAR(out.loss.item<double>(), want, 1e-10 * std::fabs(want));
    const double gscale = ref_logp.grad().abs().max().item<double>();
    EXPECT_LE(torch_test::max_abs(d.logp.grad(), ref_logp.grad()), 1e-10 * gscale);
  }
}

// Eager float64 log_softmax + gather + entropy (0 log 0 = 0).
std::tuple<at::Tensor, at::Tensor> eager(const at::Tensor& logits, const at::Tensor& tokens, double temperature) {
  const at::Tensor ls = at::log_softmax(logits.to(at::kDouble) / temperature, -1);
  const at::Tensor logp = ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  const at::Tensor safe = at::where(at::isinf(ls), at::zeros_like(ls), ls);
  return {logp, -(ls.exp() * safe).sum(-1)};
}

TEST(LogitsChecks, PositiveInfinityAndTinyTemperatures) {
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(3);
    const at::Tensor logits = at::randn({4, 10}, dtype);
    const at::Tensor tokens = at::randint(0, 10, {4}, at::kLong);
    at::Tensor hot = logits.clone();
    hot[2][5] = inf_value;
    std::string msg;
    EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(hot, tokens); }, &msg), "logits");
    EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("+inf"), std::string::npos) << msg;
    at::Tensor keep = at::ones({4}, at::kBool);
    keep[2] = false;
    EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(hot, tokens, 1.0, keep); }), "");
    // logits / temperature beyond the largest finite value of the accumulation type.
    const double tiny = dtype == at::kFloat ? 1e-37 : 1e-300;
    EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(logits * 1e10, tokens, tiny); }, &msg), "temperature");
  }
  // float32: 1/temperature itself overflows.
  const at::Tensor logits = at::randn({4, 10}, at::kFloat);
  const at::Tensor tokens = at::randint(0, 10, {4}, at::kLong);
  std::string msg;
  EXPECT_EQ(thrown([&] { reco::torch::token_logp_entropy(logits, tokens, 1e-300); }, &msg), "temperature");
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  // float64 at 1e-300 is representable: the (near one-hot) result of the definition.
  const at::Tensor x = at::randn({4, 10}, at::kDouble).requires_grad_(true);
  auto [lp, en] = reco::torch::token_logp_entropy(x, tokens, 1e-300);
  auto [lr, er] = eager(x.detach(), tokens, 1e-300);
  EXPECT_TRUE(at::isfinite(lp).all().item<bool>());
  EXPECT_LE((lp - lr).abs().max().item<double>(), 1e-12 * lr.abs().max().item<double>());
  EXPECT_LE((en - er).abs().max().item<double>(), 1e-12);
}

// Sequence-first logits [T, R, V] used as [R, T, V] through transpose(0, 1): the gradient is one
// tensor of the logits' size (it used to be R times that), with the eager float64 values.
TEST(LogitsChecks, TransposedLogitsBackwardAllocatesOneTensor) {
  const int64_t T = 6, R = 8, V = 33;
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, V, {R, T}, at::kLong);
  const at::Tensor g_logp = at::randn({R, T}, at::kDouble), g_ent = at::randn({R, T}, at::kDouble);
  struct layout {
    const char* name;
    std::function<at::Tensor(const at::Tensor&)> view;  // [R, T, V] view of a base tensor
    std::vector<int64_t> base;
  };
  const std::vector<layout> layouts = {
      {"transposed", [=](const at::Tensor& b) { return b.transpose(0, 1); }, {T, R, V}},
      {"transposed, last step dropped", [=](const at::Tensor& b) { return b.transpose(0, 1).slice(1, 0, T); },
       {T + 1, R, V}},
      {"transposed, vocabulary slice", [=](const at::Tensor& b) { return b.transpose(0, 1).narrow(2, 1, V); },
       {T, R, V + 3}},
  };
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.name);
    const at::Tensor base = at::randn(l.base, at::kDouble);
    const at::Tensor logits = l.view(base).requires_grad_(false);
    const at::Tensor x = logits.detach().requires_grad_(true);  // a leaf with the strided layout
    ASSERT_EQ(x.strides(), logits.strides());
    auto [lp, en] = reco::torch::token_logp_entropy(x, tokens, 0.8);
    const at::Tensor grad =
        torch::autograd::grad({(lp * g_logp + en * g_ent).sum()}, {x}, {}, /*retain_graph=*/false)[0];
    ASSERT_EQ(grad.sizes(), x.sizes());
    const int64_t bytes = grad.numel() * static_cast<int64_t>(grad.element_size());
    if (std::string(l.name) == "transposed, vocabulary slice") {
      // Rows with gaps: a buffer of at most the rows' span (here (V + 3) / V of the logits).
      EXPECT_LE(static_cast<int64_t>(grad.storage().nbytes()), bytes * (V + 3) / V);
    } else {
      EXPECT_EQ(static_cast<int64_t>(grad.storage().nbytes()), bytes);
    }
    const at::Tensor xr = logits.detach().clone().requires_grad_(true);
    auto [lr, er] = eager(xr, tokens, 0.8);
    (lr * g_logp + er * g_ent).sum().backward();
    EXPECT_LE((lp - lr).abs().max().item<double>(), 1e-12);
    EXPECT_LE((en - er).abs().max().item<double>(), 1e-12);
    EXPECT_LE((grad - xr.grad()).abs().max().item<double>(), 1e-12);
  }
}

}  // namespace
