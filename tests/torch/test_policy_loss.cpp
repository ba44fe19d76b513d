// reco::torch::policy_loss against plain-LibTorch references: every preset, both layouts,
// float64 (<= 1e-10) and float32 (<= 1e-5), loss and autograd gradient, plus the diagnostics,
// bf16/fp16 inputs, prompt ids, global normalisers, custom objectives and non-contiguous inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "reco/reco.hpp"
#include "reco/torch/policy_loss.hpp"
#include "torch/test_batches.hpp"

namespace {

using torch_test::batch;
using torch_test::make_batch;
using torch_test::max_abs;

struct tolerance {
  double value, grad;
};

// The adapter's loss and gradient for one preset, against the reference on the same values.
void check_preset(const std::string& name, const batch& b, at::ScalarType dt, tolerance tol,
                  bool token_weights = false) {
  SCOPED_TRACE(name + (b.packed ? " packed " : " padded ") + c10::toString(dt));
  reco::torch::policy_inputs in = torch_test::inputs(b, dt, token_weights);
  reco::torch::policy_output out = reco::torch::policy_loss(name, in);
  ASSERT_EQ(out.loss.dim(), 0);
  ASSERT_EQ(out.loss.scalar_type(), dt == at::kDouble ? at::kDouble : at::kFloat);
  out.loss.backward();
  const at::Tensor grad = in.logp.grad();
  ASSERT_TRUE(grad.defined());
  ASSERT_EQ(grad.scalar_type(), dt);

  const at::Tensor ref_logp = in.logp.detach().to(at::kDouble).requires_grad_(true);
  const torch_ref::padded_batch pb = torch_test::padded_view(b, in, ref_logp);
  const torch_ref::result ref = torch_ref::loss(torch_ref::preset(name), pb);
  ref.loss.backward();

  const double loss = out.loss.item<double>(), want = ref.loss.item<double>();
  EXPECT_LE(std::abs(loss - want), tol.value) << "loss " << loss << " vs " << want;
  EXPECT_LE(max_abs(grad, ref_logp.grad()), tol.grad);
  // Masked and padding tokens get exactly 0.
  EXPECT_EQ(grad.masked_select(~in.mask).abs().sum().item<double>(), 0.0);

  // The diagnostics the reference also computes.
  const reco::objective_result& s = out.stats;
  EXPECT_NEAR(s.policy_loss, ref.policy, tol.value);
  EXPECT_NEAR(s.kl_loss, ref.kl, tol.value);
  EXPECT_NEAR(s.stats.clip_frac, ref.clip_frac, 1e-12);
  EXPECT_NEAR(s.stats.dual_clip_frac, ref.dual_frac, 1e-12);
  // A mean of log-ratios of both signs: for float inputs its error is u·|l| per token (docs/conventions.md).
  EXPECT_NEAR(s.stats.ppo_kl, ref.ppo_kl, dt == at::kDouble ? 1e-9 : 1e-6);
  // The variance ratio reaches e^20 where p_old -> 1: compare relatively.
  EXPECT_LE(std::abs(s.stats.ratio_mean - ref.ratio_mean), (dt == at::kDouble ? 1e-12 : 1e-6) * (1 + std::abs(ref.ratio_mean)));
  EXPECT_NEAR(s.stats.kept_frac, ref.kept_frac, 1e-12);
  EXPECT_EQ(s.stats.weight_cap_hits, ref.cap_hits);
  EXPECT_NEAR(s.stats.weight_max, ref.weight_max, 1e-9);
  EXPECT_EQ(s.stats.valid_tokens, ref.valid_tokens);
  EXPECT_EQ(s.stats.policy_tokens, ref.policy_tokens);
  // The stats tensor is the same record, flattened.
  ASSERT_EQ(out.stats_tensor.numel(), reco::torch::stats_size);
  EXPECT_EQ(out.stats_tensor[0].item<double>(), s.loss);
  EXPECT_EQ(out.stats_tensor[4].item<double>(), s.stats.clip_frac);
}

class Presets : public ::testing::TestWithParam<std::string> {};

TEST_P(Presets, Float64BothLayouts) {
  for (uint64_t seed = 1; seed <= 3; ++seed)
    for (bool packed : {false, true})
      check_preset(GetParam(), make_batch(100 * seed + packed, packed), at::kDouble, {1e-10, 1e-10});
}

TEST_P(Presets, Float32BothLayouts) {
  for (uint64_t seed = 4; seed <= 5; ++seed)
    for (bool packed : {false, true})
      check_preset(GetParam(), make_batch(100 * seed + packed, packed), at::kFloat, {1e-5, 1e-5});
}

TEST_P(Presets, TokenWeights) {
  check_preset(GetParam(), make_batch(77, true), at::kDouble, {1e-10, 1e-10}, /*token_weights=*/true);
}

INSTANTIATE_TEST_SUITE_P(All, Presets,
                         ::testing::Values("grpo", "dr_grpo", "dapo", "gspo", "cispo", "aspo", "reco", "reco_no_cap",
                                           "reco_response_only", "reco_token_only", "dapo_reco", "rule_80_20",
                                           "rule_80_20_reco"));

// The sweep above must exercise the branches it claims to: clipping on both sides, the dual
// clips, the weight cap and exact on-policy responses.
TEST(Coverage, BranchesOccur) {
  double clip = 0, dual_hard = 0, dual_soft = 0;
  int64_t caps = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const batch b = make_batch(100 * seed, false);
    auto run = [&](const char* name) { return reco::torch::policy_loss(name, torch_test::inputs(b, at::kDouble)).stats; };
    clip += run("grpo").stats.clip_frac;
    dual_hard += run("grpo").stats.dual_clip_frac;
    dual_soft += run("aspo").stats.dual_clip_frac;
    caps += run("reco").stats.weight_cap_hits;
  }
  EXPECT_GT(clip, 0.0);
  EXPECT_GT(dual_hard, 0.0);
  EXPECT_GT(dual_soft, 0.0);
  EXPECT_GT(caps, 0);
}

// On-policy (old_logp undefined): the variance ratio equals the token ratio, so reco_token_only
// and grpo agree to rounding.
TEST(OnPolicy, VarianceRatioMatchesTokenRatio) {
  const batch b = make_batch(5, false);
  reco::torch::policy_inputs a = torch_test::inputs(b, at::kDouble);
  a.old_logp = at::Tensor();
  reco::torch::policy_inputs c = torch_test::inputs(b, at::kDouble);
  c.old_logp = at::Tensor();
  auto la = reco::torch::policy_loss("grpo", a).loss;
  auto lc = reco::torch::policy_loss("reco_token_only", c).loss;
  la.backward();
  lc.backward();
  EXPECT_NEAR(la.item<double>(), lc.item<double>(), 1e-14);
  EXPECT_LE(max_abs(a.logp.grad(), c.logp.grad()), 1e-14);
  EXPECT_NE(a.logp.grad().abs().sum().item<double>(), 0.0);
}

// bf16 and fp16 inputs run in float32: the loss equals the float32 run on the same values and
// the gradient is that run's gradient rounded to the input type.
TEST(HalfInputs, MatchFloat32OnTheSameValues) {
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    for (const char* name : {"grpo", "reco", "dapo", "rule_80_20"}) {
      SCOPED_TRACE(std::string(name) + " " + c10::toString(half));
      const batch b = make_batch(31, true);
      reco::torch::policy_inputs h = torch_test::inputs(b, half);
      reco::torch::policy_inputs f = torch_test::inputs(b, half);
      f.logp = h.logp.detach().to(at::kFloat).requires_grad_(true);
      f.old_logp = h.old_logp.to(at::kFloat);
      f.ref_logp = h.ref_logp.to(at::kFloat);
      f.entropy = h.entropy.to(at::kFloat);
      f.rewards = h.rewards.to(at::kFloat);
      auto oh = reco::torch::policy_loss(name, h);
      auto of = reco::torch::policy_loss(name, f);
      EXPECT_EQ(oh.loss.scalar_type(), at::kFloat);
      EXPECT_EQ(oh.loss.item<float>(), of.loss.item<float>());
      oh.loss.backward();
      of.loss.backward();
      ASSERT_EQ(h.logp.grad().scalar_type(), half);
      EXPECT_TRUE(at::equal(h.logp.grad(), f.logp.grad().to(half)));
      // And close to the float64 reference on the rounded values.
      const at::Tensor ref_logp = h.logp.detach().to(at::kDouble).requires_grad_(true);
      const auto ref = torch_ref::loss(torch_ref::preset(name), torch_test::padded_view(b, h, ref_logp));
      EXPECT_NEAR(oh.loss.item<double>(), ref.loss.item<double>(), 1e-5);
    }
  }
}

// Prompt ids give the same groups as the offsets; the layout does not matter.
TEST(Groups, PromptIdsEqualGroupOffsets) {
  for (bool packed : {false, true}) {
    const batch b = make_batch(9, packed);
    reco::torch::policy_inputs a = torch_test::inputs(b, at::kDouble);
    reco::torch::policy_inputs p = torch_test::inputs(b, at::kDouble);
    p.group_offsets = at::Tensor();
    p.prompt_ids = at::tensor(b.prompt_ids, at::kLong).to(at::kInt);
    auto la = reco::torch::policy_loss("reco", a);
    auto lp = reco::torch::policy_loss("reco", p);
    la.loss.backward();
    lp.loss.backward();
    EXPECT_EQ(la.loss.item<double>(), lp.loss.item<double>());
    EXPECT_TRUE(at::equal(a.logp.grad(), p.logp.grad()));
  }
}

// Global normalisers: two halves of a batch (split at a group boundary) called with the counts
// of the whole batch sum to the whole batch's loss and gradient.
TEST(Normalisers, SplitBatchSumsToWhole) {
  const batch b = make_batch(13, true);
  const int64_t split_group = 5;
  const int64_t r_split = b.group_offsets[split_group];
  for (const char* name : {"dapo", "grpo", "reco"}) {
    SCOPED_TRACE(name);
    reco::torch::policy_inputs whole = torch_test::inputs(b, at::kDouble);
    auto w = reco::torch::policy_loss(name, whole);
    w.loss.backward();
    const at::Tensor logp = whole.logp.detach().clone().requires_grad_(true);
    double total = 0;
    for (int part = 0; part < 2; ++part) {
      const int64_t r0 = part ? r_split : 0, r1 = part ? b.R : r_split;
      const int64_t t0 = b.offsets[r0], t1 = b.offsets[r1];
      reco::torch::policy_inputs in;
      in.logp = logp.slice(0, t0, t1);
      in.old_logp = whole.old_logp.slice(0, t0, t1);
      in.ref_logp = whole.ref_logp.slice(0, t0, t1);
      in.entropy = whole.entropy.slice(0, t0, t1);
      in.mask = whole.mask.slice(0, t0, t1);
      in.offsets = at::tensor(b.offsets, at::kLong).slice(0, r0, r1 + 1) - t0;
      in.rewards = whole.rewards.slice(0, r0, r1);
      std::vector<int64_t> go;
      for (int64_t g : b.group_offsets)
        if (g >= r0 && g <= r1) go.push_back(g - r0);
      in.group_offsets = at::tensor(go, at::kLong);
      in.normalisers.tokens = w.stats.stats.valid_tokens;
      in.normalisers.responses = w.stats.stats.nonempty_responses;
      auto o = reco::torch::policy_loss(name, in);
      o.loss.backward();
      total += o.loss.item<double>();
    }
    EXPECT_NEAR(total, w.loss.item<double>(), 1e-12);
    EXPECT_LE(max_abs(logp.grad(), whole.logp.grad()), 1e-12);
  }
}

// A global token count scales a token_mean loss (and its gradient) by local / global; for the
// 80/20 rule too, whose policy term divides by all valid tokens.
TEST(Normalisers, GlobalTokenCountScalesTokenMean) {
  for (const char* name : {"dapo", "rule_80_20"}) {
    const batch b = make_batch(17, false);
    reco::torch::policy_inputs local = torch_test::inputs(b, at::kDouble);
    auto l = reco::torch::policy_loss(name, local);
    l.loss.backward();
    reco::torch::policy_inputs global = torch_test::inputs(b, at::kDouble);
    global.normalisers.tokens = 3 * l.stats.stats.valid_tokens;
    auto g = reco::torch::policy_loss(name, global);
    g.loss.backward();
    EXPECT_NE(l.loss.item<double>(), 0.0);
    EXPECT_NEAR(g.loss.item<double>(), l.loss.item<double>() / 3.0, 1e-15);
    EXPECT_LE(max_abs(global.logp.grad() * 3.0, local.logp.grad()), 1e-15);
  }
}

// Overrides change the named parameter: the reference with the same constants agrees.
TEST(Overrides, ChangeTheObjective) {
  const batch b = make_batch(21, false);
  reco::torch::policy_inputs in = torch_test::inputs(b, at::kDouble);
  auto out = reco::torch::policy_loss("reco", in, {{"clip.eps_high", 0.28}, {"weight.cap", 2.0}, {"kl.beta", 0.01}});
  out.loss.backward();
  torch_ref::config c = torch_ref::preset("reco");
  c.eps_high = 0.28;
  c.cap = 2.0;
  c.kl_beta = 0.01;
  const at::Tensor ref_logp = in.logp.detach().clone().requires_grad_(true);
  const auto ref = torch_ref::loss(c, torch_test::padded_view(b, in, ref_logp));
  ref.loss.backward();
  EXPECT_NEAR(out.loss.item<double>(), ref.loss.item<double>(), 1e-10);
  EXPECT_LE(max_abs(in.logp.grad(), ref_logp.grad()), 1e-10);
  // An enumeration by index: dual clip off removes the dual-clip events.
  auto off = reco::torch::policy_loss("grpo", torch_test::inputs(make_batch(100, false), at::kDouble),
                                      {{"clip.dual_clip", 0}});
  EXPECT_EQ(off.stats.stats.dual_clip_frac, 0.0);
  // The keys each preset accepts.
  const auto keys = reco::torch::override_keys("rule_80_20");
  EXPECT_NE(std::find(keys.begin(), keys.end(), "select.rho"), keys.end());
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "weight.cap"), keys.end());
  EXPECT_EQ(reco::torch::preset_names().size(), 21u);
}

// A custom objective with an entropy bonus: the gradient flows into the entropy input.
TEST(CustomObjective, EntropyBonusGradient) {
  using obj_t = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                reco::token_mean, reco::entropy_bonus>;
  obj_t obj;
  reco::torch::set_params(obj, {{"entropy.coef", 0.01}, {"clip.eps_high", 0.28}});
  EXPECT_EQ(obj.entropy.params.coef, 0.01);
  const batch b = make_batch(23, true);
  reco::torch::policy_inputs in = torch_test::inputs(b, at::kDouble);
  in.entropy = in.entropy.clone().requires_grad_(true);
  auto out = reco::torch::policy_loss(obj, in);
  out.loss.backward();
  ASSERT_TRUE(in.entropy.grad().defined());

  torch_ref::config c = torch_ref::preset("dapo");
  c.dual = torch_ref::dual_kind::off;
  c.eps_high = 0.28;
  c.entropy_coef = 0.01;
  const at::Tensor ref_logp = in.logp.detach().clone().requires_grad_(true);
  const at::Tensor ref_entropy = in.entropy.detach().clone().requires_grad_(true);
  reco::torch::policy_inputs view = in;
  view.entropy = ref_entropy;
  const auto ref = torch_ref::loss(c, torch_test::padded_view(b, view, ref_logp));
  ref.loss.backward();
  EXPECT_NEAR(out.loss.item<double>(), ref.loss.item<double>(), 1e-10);
  EXPECT_NEAR(out.stats.entropy_loss, ref.entropy_part, 1e-12);
  EXPECT_LE(max_abs(in.logp.grad(), ref_logp.grad()), 1e-10);
  EXPECT_LE(max_abs(in.entropy.grad(), ref_entropy.grad()), 1e-12);
  EXPECT_LT(in.entropy.grad().min().item<double>(), 0.0);
}

// Presets by object and by name give the same result.
TEST(CustomObjective, PresetObjectEqualsName) {
  const batch b = make_batch(29, false);
  reco::torch::policy_inputs a = torch_test::inputs(b, at::kFloat);
  reco::torch::policy_inputs n = torch_test::inputs(b, at::kFloat);
  reco::presets::dapo_reco obj;
  obj.clip.params.eps_low = 0.1;
  auto oa = reco::torch::policy_loss(obj, a);
  auto on = reco::torch::policy_loss("dapo_reco", n, {{"clip.eps_low", 0.1}});
  EXPECT_EQ(oa.loss.item<float>(), on.loss.item<float>());
}

// Non-contiguous inputs are made contiguous; the gradient reaches the base tensor.
TEST(Layout, NonContiguousInputs) {
  const batch b = make_batch(37, false);
  reco::torch::policy_inputs a = torch_test::inputs(b, at::kDouble);
  auto oa = reco::torch::policy_loss("reco", a);
  oa.loss.backward();

  const at::Tensor base = a.logp.detach().t().contiguous().requires_grad_(true);  // [T, R]
  reco::torch::policy_inputs t = torch_test::inputs(b, at::kDouble);
  t.logp = base.t();
  t.old_logp = a.old_logp.t().contiguous().t();
  t.mask = a.mask.t().contiguous().t();
  t.rewards = at::stack({a.rewards, a.rewards}, 1).select(1, 0);
  ASSERT_FALSE(t.logp.is_contiguous());
  ASSERT_FALSE(t.rewards.is_contiguous());
  auto ot = reco::torch::policy_loss("reco", t);
  ot.loss.backward();
  EXPECT_EQ(oa.loss.item<double>(), ot.loss.item<double>());
  EXPECT_TRUE(at::equal(base.grad().t(), a.logp.grad()));
}

// The backward scales by the incoming gradient, and accumulates like any autograd leaf.
TEST(Autograd, ScalesByIncomingGradient) {
  const batch b = make_batch(41, true);
  reco::torch::policy_inputs in = torch_test::inputs(b, at::kDouble);
  auto out = reco::torch::policy_loss("grpo", in);
  out.loss.backward();
  const at::Tensor g1 = in.logp.grad().clone();
  in.logp.mutable_grad() = at::Tensor();
  auto out2 = reco::torch::policy_loss("grpo", in);
  (out2.loss * -2.5 + 1.0).backward();
  EXPECT_LE(max_abs(in.logp.grad(), g1 * -2.5), 1e-15);
  // Second derivatives are refused rather than silently wrong.
  auto out3 = reco::torch::policy_loss("grpo", in);
  EXPECT_THROW(::torch::autograd::grad({out3.loss}, {in.logp}, {}, /*retain_graph=*/true, /*create_graph=*/true),
               std::exception);
  // Without requires_grad there is no graph, and the loss is the same.
  reco::torch::policy_inputs nograd = torch_test::inputs(b, at::kDouble);
  nograd.logp = nograd.logp.detach();
  auto o = reco::torch::policy_loss("grpo", nograd);
  EXPECT_FALSE(o.loss.requires_grad());
  EXPECT_EQ(o.loss.item<double>(), out.loss.item<double>());
}

// An empty batch is valid and gives a zero loss.
TEST(Layout, EmptyBatch) {
  reco::torch::policy_inputs in;
  in.logp = at::zeros({0}, at::kDouble).requires_grad_(true);
  in.old_logp = at::zeros({0}, at::kDouble);
  in.ref_logp = at::zeros({0}, at::kDouble);
  in.offsets = at::zeros({1}, at::kLong);
  in.rewards = at::zeros({0}, at::kDouble);
  in.group_offsets = at::zeros({1}, at::kLong);
  auto out = reco::torch::policy_loss("grpo", in);
  EXPECT_EQ(out.loss.item<double>(), 0.0);
  out.loss.backward();
  EXPECT_EQ(in.logp.grad().numel(), 0);
}

}  // namespace
