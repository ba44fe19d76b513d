// Bad inputs to reco::torch::policy_loss: each case throws reco::error naming the argument.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "reco/reco.hpp"
#include "reco/torch/policy_loss.hpp"
#include "torch/test_batches.hpp"

namespace {

using reco::torch::policy_inputs;

// The argument named by the reco::error that f throws ("" when it throws none).
std::string thrown_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const reco::error& e) {
    EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos) << "the message must name the argument";
    return e.argument();
  }
  return "";
}

struct Errors : ::testing::Test {
  torch_test::batch padded = torch_test::make_batch(3, false, 4, 6);
  torch_test::batch packed = torch_test::make_batch(3, true, 4, 6);

  // Runs `preset` on the padded (or packed) batch after `edit`.
  std::string run(const std::string& preset, const std::function<void(policy_inputs&)>& edit, bool use_packed = false,
                  const std::map<std::string, double>& overrides = {}) {
    policy_inputs in = torch_test::inputs(use_packed ? packed : padded, at::kFloat);
    edit(in);
    return thrown_argument([&] { reco::torch::policy_loss(preset, in, overrides); });
  }
};

TEST_F(Errors, ValidInputsPass) { EXPECT_EQ(run("grpo", [](policy_inputs&) {}), ""); }

TEST_F(Errors, WrongDtypes) {
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = in.logp.detach().to(at::kLong); }), "logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.old_logp = in.old_logp.to(at::kInt); }), "old_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.mask = in.mask.to(at::kFloat); }), "mask");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = in.rewards.to(at::kLong); }), "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.group_offsets = in.group_offsets.to(at::kFloat); }),
            "group_offsets");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.offsets = in.offsets.to(at::kDouble); }, true), "offsets");
  EXPECT_EQ(run("grpo",
                [&](policy_inputs& in) {
                  in.group_offsets = at::Tensor();
                  in.prompt_ids = at::tensor(padded.prompt_ids, at::kLong).to(at::kFloat);
                }),
            "prompt_ids");
}

TEST_F(Errors, DeviceMix) {
  // Meta tensors stand in for a second device on a CPU-only build.
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.old_logp = at::empty(in.old_logp.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta)); }),
            "old_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = at::empty(in.rewards.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta)); }),
            "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = at::empty(in.logp.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta)); }),
            "logp");
}

TEST_F(Errors, ShapeMismatch) {
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.old_logp = in.old_logp.t(); }), "old_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.ref_logp = in.ref_logp.reshape({-1}); }), "ref_logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.mask = in.mask.slice(1, 0, 3); }), "mask");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = in.rewards.slice(0, 1); }), "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = in.rewards.unsqueeze(1); }), "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = in.logp.detach().unsqueeze(0); }), "logp");
  // Packed layout: logp must be 1-D.
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = in.logp.detach().unsqueeze(0); }, true), "logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.offsets = in.offsets.view({1, -1}); }, true), "offsets");
}

TEST_F(Errors, MissingRequiredInputs) {
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.logp = at::Tensor(); }), "logp");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.rewards = at::Tensor(); }), "rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.ref_logp = at::Tensor(); }), "ref_logp");
  EXPECT_EQ(run("rule_80_20", [](policy_inputs& in) { in.entropy = at::Tensor(); }), "entropy");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.group_offsets = at::Tensor(); }), "group_offsets");
  // dapo has no KL term: ref_logp may be absent.
  EXPECT_EQ(run("dapo", [](policy_inputs& in) { in.ref_logp = at::Tensor(); }), "");
  // caller_weight needs response_weights.
  using obj_t = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight,
                                reco::token_mean>;
  policy_inputs in = torch_test::inputs(padded, at::kFloat);
  EXPECT_EQ(thrown_argument([&] { reco::torch::policy_loss(obj_t{}, in); }), "response_weights");
  in.response_weights = at::ones({padded.R}, at::kFloat);
  EXPECT_EQ(thrown_argument([&] { reco::torch::policy_loss(obj_t{}, in); }), "");
}

TEST_F(Errors, Groups) {
  EXPECT_EQ(run("grpo", [&](policy_inputs& in) { in.prompt_ids = at::tensor(padded.prompt_ids, at::kLong); }),
            "prompt_ids");  // both given
  // Responses of one prompt split into two runs.
  EXPECT_EQ(run("grpo",
                [&](policy_inputs& in) {
                  auto ids = padded.prompt_ids;
                  std::swap(ids.front(), ids.back());
                  in.group_offsets = at::Tensor();
                  in.prompt_ids = at::tensor(ids, at::kLong);
                }),
            "prompt_ids");
  EXPECT_EQ(run("grpo", [&](policy_inputs& in) { in.group_offsets = in.group_offsets.slice(0, 0, -1); }),
            "batch.group_offsets");  // does not end at R
  EXPECT_EQ(run("grpo",
                [&](policy_inputs& in) {
                  in.offsets = in.offsets.flip(0);
                },
                true),
            "batch.layout.offsets");
}

TEST_F(Errors, PresetsAndOverrides) {
  auto none = [](policy_inputs&) {};
  EXPECT_EQ(run("grpoo", none), "preset");
  EXPECT_EQ(run("grpo", none, false, {{"clip.eps_lo", 0.1}}), "overrides.clip.eps_lo");
  EXPECT_EQ(run("grpo", none, false, {{"weight.cap", 5}}), "overrides.weight.cap");  // grpo has no weight cap
  // dapo has no KL term of its own: a kl.* key adds one (CPU tensors), which then reads ref_logp
  // (issue 11: KL selectable by key for every preset; this line expected an error before).
  EXPECT_EQ(run("dapo", none, false, {{"kl.beta", 0.1}}), "");
  EXPECT_EQ(run("dapo", [](policy_inputs& in) { in.ref_logp = at::Tensor(); }, false, {{"kl.beta", 0.1}}), "ref_logp");
  EXPECT_EQ(run("dapo", none, false, {{"kl.bta", 0.1}}), "overrides.kl.bta");
  EXPECT_EQ(run("grpo", none, false, {{"eps", 0.1}}), "overrides.eps");
  EXPECT_EQ(run("grpo", none, false, {{"kl.clamp", 0.5}}), "overrides.kl.clamp");          // a flag
  EXPECT_EQ(run("grpo", none, false, {{"clip.dual_clip", 3}}), "overrides.clip.dual_clip"); // a choice
  EXPECT_EQ(run("grpo", none, false, {{"clip.eps_low", 2.0}}), "clip.params.eps_low");      // out of range
  EXPECT_EQ(run("rule_80_20", none, false, {{"select.rho", 0.0}}), "select.params.rho");
  try {
    reco::torch::policy_loss("grpo", torch_test::inputs(padded, at::kFloat), {{"weight.cap", 5}});
    FAIL() << "expected reco::error";
  } catch (const reco::error& e) {
    // The message lists the keys the preset does accept.
    EXPECT_NE(std::string(e.what()).find("clip.eps_high"), std::string::npos) << e.what();
  }
}

TEST_F(Errors, BadValues) {
  EXPECT_EQ(run("reco", [](policy_inputs& in) { in.logp = (in.logp.detach() + 0.5).requires_grad_(); }), "batch.logp");
  EXPECT_EQ(run("grpo",
                [](policy_inputs& in) {
                  in.rewards = in.rewards.clone();
                  in.rewards[1] = std::numeric_limits<float>::quiet_NaN();
                }),
            "batch.rewards");
  EXPECT_EQ(run("grpo", [](policy_inputs& in) { in.normalisers.tokens = -1; }), "normalisers");
}

}  // namespace
