// The adapter's CUDA path against its CPU path: every preset in both layouts, the no-sync
// stats mode, prompt ids, device-mix errors, and the logits kernels at N = 8192, V = 151,936
// (bf16) and beyond 65,535 rows. Skipped unless reco_torch has CUDA and a device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"
#include "reco/torch/token_logp_entropy.hpp"
#include "torch/test_batches.hpp"

namespace {

using torch_test::max_abs;

bool cuda_ready() { return RECO_TORCH_WITH_CUDA && at::hasCUDA(); }

#define REQUIRE_CUDA() \
  if (!cuda_ready()) GTEST_SKIP() << "reco_torch built without CUDA, or no CUDA device"

reco::torch::policy_inputs to_cuda(reco::torch::policy_inputs in) {
  auto move = [](at::Tensor& t) {
    if (t.defined()) t = t.detach().to(at::kCUDA);
  };
  move(in.logp);
  in.logp.requires_grad_(true);
  for (at::Tensor* t : {&in.old_logp, &in.ref_logp, &in.entropy, &in.mask, &in.offsets, &in.rewards, &in.advantages,
                        &in.group_offsets, &in.prompt_ids, &in.token_weights, &in.response_weights})
    move(*t);
  return in;
}

TEST(Cuda, PresetsMatchCpu) {
  REQUIRE_CUDA();
  for (const std::string& name : reco::torch::preset_names())
    for (bool packed : {false, true}) {
      if (name == "clip_cov" || name == "kl_cov") continue;  // CPU only: CovarianceRejected below
      for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
        SCOPED_TRACE(name + (packed ? " packed " : " padded ") + c10::toString(dt));
        const torch_test::batch b = torch_test::make_batch(packed ? 7 : 8, packed);
        reco::torch::policy_inputs cpu = torch_test::inputs(b, dt);
        reco::torch::policy_inputs gpu = to_cuda(cpu);
        auto oc = reco::torch::policy_loss(name, cpu);
        auto og = reco::torch::policy_loss(name, gpu);
        oc.loss.backward();
        og.loss.backward();
        ASSERT_TRUE(og.loss.is_cuda());
        const double tol = dt == at::kDouble ? 1e-12 : 1e-6;
        EXPECT_NEAR(og.loss.item<double>(), oc.loss.item<double>(), tol);
        EXPECT_LE(max_abs(gpu.logp.grad().cpu(), cpu.logp.grad()), tol);
        EXPECT_NEAR(og.stats.stats.clip_frac, oc.stats.stats.clip_frac, 1e-12);
        EXPECT_EQ(og.stats.stats.valid_tokens, oc.stats.stats.valid_tokens);
        EXPECT_EQ(og.stats.stats.weight_cap_hits, oc.stats.stats.weight_cap_hits);
      }
    }
}

// Clip-Cov / KL-Cov select on the host: CUDA tensors are refused with the preset's name.
TEST(Cuda, CovarianceRejected) {
  REQUIRE_CUDA();
  const torch_test::batch b = torch_test::make_batch(8, false);
  for (const char* name : {"clip_cov", "kl_cov"}) {
    reco::torch::policy_inputs gpu = to_cuda(torch_test::inputs(b, at::kDouble));
    try {
      reco::torch::policy_loss(name, gpu);
      ADD_FAILURE() << name << " ran on CUDA";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("covariance_selection"), std::string::npos) << e.what();
    }
  }
}

TEST(Cuda, NoSyncStatsAndPromptIds) {
  REQUIRE_CUDA();
  const torch_test::batch b = torch_test::make_batch(11, true);
  reco::torch::policy_inputs cpu = torch_test::inputs(b, at::kFloat);
  reco::torch::policy_inputs gpu = to_cuda(cpu);
  gpu.host_stats = false;
  gpu.group_offsets = at::Tensor();
  gpu.prompt_ids = at::tensor(b.prompt_ids, at::kLong).to(at::kCUDA);
  auto oc = reco::torch::policy_loss("reco", cpu);
  auto og = reco::torch::policy_loss("reco", gpu);
  EXPECT_EQ(og.stats.stats.valid_tokens, 0);  // not copied to the host
  ASSERT_TRUE(og.stats_tensor.is_cuda());
  const at::Tensor s = og.stats_tensor.cpu();
  EXPECT_NEAR(s[0].item<double>(), oc.loss.item<double>(), 1e-6);
  EXPECT_EQ(s[reco::torch::stats_size - 1].item<double>(), 0.0);  // status
  // Bad data is reported in the status word instead of thrown.
  reco::torch::policy_inputs bad = to_cuda(cpu);
  bad.host_stats = false;
  bad.logp = (bad.logp.detach() + 1.0).requires_grad_(true);
  auto ob = reco::torch::policy_loss("reco", bad);
  EXPECT_NE(ob.stats_tensor[reco::torch::stats_size - 1].item<double>(), 0.0);
  // ... and thrown with host_stats.
  bad.host_stats = true;
  EXPECT_THROW(reco::torch::policy_loss("reco", bad), reco::error);
}

TEST(Cuda, DeviceMixIsAnError) {
  REQUIRE_CUDA();
  const torch_test::batch b = torch_test::make_batch(12, false);
  reco::torch::policy_inputs gpu = to_cuda(torch_test::inputs(b, at::kFloat));
  gpu.rewards = gpu.rewards.cpu();
  try {
    reco::torch::policy_loss("grpo", gpu);
    FAIL() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "rewards");
  }
}

// Responses [a, b) of a packed step as a micro-batch of its own; groups from prompt ids, so that a
// prompt's responses may continue in the next micro-batch.
reco::torch::policy_inputs responses(const torch_test::batch& b, const reco::torch::policy_inputs& in, int64_t a,
                                     int64_t e) {
  const int64_t t0 = b.offsets[static_cast<size_t>(a)], t1 = b.offsets[static_cast<size_t>(e)];
  reco::torch::policy_inputs m;
  m.logp = in.logp.detach().slice(0, t0, t1).clone().requires_grad_(true);
  m.old_logp = in.old_logp.slice(0, t0, t1);
  m.ref_logp = in.ref_logp.slice(0, t0, t1);
  m.entropy = in.entropy.slice(0, t0, t1);
  m.mask = in.mask.slice(0, t0, t1);
  m.offsets = in.offsets.slice(0, a, e + 1) - t0;
  m.rewards = in.rewards.slice(0, a, e);
  m.prompt_ids = at::tensor(b.prompt_ids, at::kLong).to(in.logp.device()).slice(0, a, e);
  return m;
}

const c10::intrusive_ptr<c10d::ProcessGroup> no_group;  // gradient accumulation in one process

// Gradient accumulation on CUDA tensors: a step in three uneven micro-batches (one empty, a group
// across two), its plan made from the device tensors (build_step_plan, no process group: the
// token passes on the device), each micro-batch's call on the device. The calls add up to one call on the whole step,
// and equal the same planned calls on CPU tensors.
TEST(Cuda, PlannedMicroBatchesAddUpToTheWholeStep) {
  REQUIRE_CUDA();
  const torch_test::batch b = torch_test::make_batch(21, true);
  const int64_t R = b.R;
  const std::vector<int64_t> bounds{0, R / 3, R / 3, R / 3 + R / 2, R};
  int step = 0;
  for (const std::string& name : reco::torch::preset_names()) {
    if (name == "clip_cov" || name == "kl_cov") continue;  // one call only, CPU only
    for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
      SCOPED_TRACE(name + " " + c10::toString(dt));
      const reco::torch::policy_inputs whole_cpu = torch_test::inputs(b, dt);
      reco::torch::policy_inputs whole = to_cuda(whole_cpu);
      whole.group_offsets = at::Tensor();
      whole.prompt_ids = at::tensor(b.prompt_ids, at::kLong).to(at::kCUDA);
      auto ow = reco::torch::policy_loss(name, whole);
      ow.loss.backward();
      std::vector<reco::torch::policy_inputs> gpu, cpu;
      for (size_t p = 0; p + 1 < bounds.size(); ++p) {
        gpu.push_back(responses(b, whole, bounds[p], bounds[p + 1]));
        cpu.push_back(responses(b, whole_cpu, bounds[p], bounds[p + 1]));
      }
      reco::torch::step_options opt;
      opt.step = static_cast<std::uint64_t>(++step);
      const auto plan_gpu = reco::torch::build_step_plan(no_group, name, gpu, {}, opt);
      const auto plan_cpu = reco::torch::build_step_plan(no_group, name, cpu, {}, opt);
      // The device's token passes (the default for CUDA tensors) against the host passes over
      // copies of the same tensors, and over the CPU tensors.
      opt.passes = reco::torch::plan_passes::host;
      const auto plan_copied = reco::torch::build_step_plan(no_group, name, gpu, {}, opt);
      EXPECT_EQ(plan_gpu.plan.kept(), plan_copied.plan.kept());
      EXPECT_EQ(plan_gpu.plan.kept(), plan_cpu.plan.kept());
      EXPECT_EQ(plan_gpu.plan.cut().value, plan_cpu.plan.cut().value);
      EXPECT_EQ(plan_gpu.plan.cut().ties, plan_cpu.plan.cut().ties);
      double loss = 0;
      const double tol = dt == at::kDouble ? 1e-12 : 1e-6;
      for (size_t p = 0; p < gpu.size(); ++p) {
        auto og = reco::torch::policy_loss(name, gpu[p], {}, plan_gpu, p);
        auto oc = reco::torch::policy_loss(name, cpu[p], {}, plan_cpu, p);
        ASSERT_TRUE(og.loss.is_cuda());
        og.loss.backward();
        oc.loss.backward();
        loss += og.loss.item<double>();
        EXPECT_NEAR(og.loss.item<double>(), oc.loss.item<double>(), tol * (1 + std::fabs(oc.loss.item<double>())));
        if (gpu[p].logp.numel() == 0) continue;
        EXPECT_LE(max_abs(gpu[p].logp.grad().cpu(), cpu[p].logp.grad()), tol);
        const int64_t t0 = b.offsets[static_cast<size_t>(bounds[p])];
        const at::Tensor wg = whole.logp.grad().slice(0, t0, t0 + gpu[p].logp.numel()).cpu();
        EXPECT_LE(max_abs(gpu[p].logp.grad().cpu(), wg), tol);
      }
      EXPECT_NEAR(loss, ow.loss.item<double>(), tol * (1 + std::fabs(ow.loss.item<double>())));
    }
  }
  // A call of another step's plan on the device is refused naming the plan.
  reco::torch::policy_inputs in = to_cuda(torch_test::inputs(b, at::kFloat));
  std::vector<reco::torch::policy_inputs> one{responses(b, in, 0, R)};
  reco::torch::step_options opt;
  opt.step = 1000;
  const auto plan = reco::torch::build_step_plan(no_group, "grpo", one, {}, opt);
  try {
    reco::torch::policy_loss("dapo", one[0], {}, plan, 0);
    FAIL() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "plan");
  }
}

// bf16 logits at a production shape (8192 rows, V = 151,936), against the CPU path on the same values.
TEST(Cuda, LogitsBf16AtSpecShape) {
  REQUIRE_CUDA();
  at::manual_seed(3);
  const int64_t N = 8192, V = 151936;
  const at::Tensor logits = (at::randn({N, V}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA)) * 2)
                                .to(at::kBFloat16);
  const at::Tensor tokens = at::randint(0, V, {N}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  const at::Tensor mask = at::rand({N}, at::TensorOptions().device(at::kCUDA)) > 0.3;
  const at::Tensor gl = at::randn({N}, at::TensorOptions().device(at::kCUDA));
  const at::Tensor gh = at::randn({N}, at::TensorOptions().device(at::kCUDA));

  const at::Tensor xg = logits.clone().requires_grad_(true);
  auto [lg, eg] = reco::torch::token_logp_entropy(xg, tokens, 0.7, mask);
  (lg * gl + eg * gh).sum().backward();
  const at::Tensor xc = logits.cpu().requires_grad_(true);
  auto [lc, ec] = reco::torch::token_logp_entropy(xc, tokens.cpu(), 0.7, mask.cpu());
  (lc * gl.cpu() + ec * gh.cpu()).sum().backward();
  EXPECT_LE(max_abs(lg.cpu(), lc), 1e-4);
  EXPECT_LE(max_abs(eg.cpu(), ec), 1e-4);
  const at::Tensor err = (xg.grad().cpu().to(at::kDouble) - xc.grad().to(at::kDouble)).abs() -
                         xc.grad().to(at::kDouble).abs() / 128.0;
  EXPECT_LE(err.max().item<double>(), 1e-6);
  EXPECT_EQ(xg.grad().cpu().masked_select((~mask.cpu()).unsqueeze(1).expand({N, V})).abs().sum().item<float>(), 0.0f);
}

// More rows than a grid dimension of 65,535 in one launch, and a [R, T, V] strided slice.
TEST(Cuda, LogitsManyRowsAndStridedSlice) {
  REQUIRE_CUDA();
  at::manual_seed(4);
  const auto cuda_f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  const auto cuda_i64 = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
  {
    const int64_t N = 70000, V = 64;
    const at::Tensor logits = at::randn({N, V}, cuda_f32);
    const at::Tensor tokens = at::randint(0, V, {N}, cuda_i64);
    const at::Tensor xg = logits.clone().requires_grad_(true);
    auto [lg, eg] = reco::torch::token_logp_entropy(xg, tokens);
    (lg.sum() + eg.sum()).backward();
    const at::Tensor xc = logits.cpu().requires_grad_(true);
    auto [lc, ec] = reco::torch::token_logp_entropy(xc, tokens.cpu());
    (lc.sum() + ec.sum()).backward();
    EXPECT_LE(max_abs(lg.cpu(), lc), 1e-5);
    EXPECT_LE(max_abs(eg.cpu(), ec), 1e-5);
    EXPECT_LE(max_abs(xg.grad().cpu(), xc.grad()), 1e-5);
    // A bad token is found on the device and raised like on the CPU.
    at::Tensor bad = tokens.clone();
    bad[N - 5] = V;
    EXPECT_THROW(reco::torch::token_logp_entropy(logits, bad), reco::error);
  }
  {
    const int64_t R = 6, T = 300, V = 5000;
    const at::Tensor full = at::randn({R, T + 1, V}, cuda_f32).requires_grad_(true);
    const at::Tensor tokens = at::randint(0, V, {R, T}, cuda_i64);
    auto [lg, eg] = reco::torch::token_logp_entropy(full.slice(1, 0, T), tokens, 1.3);
    (lg.sum() - eg.sum()).backward();
    const at::Tensor xc = full.detach().cpu().requires_grad_(true);
    auto [lc, ec] = reco::torch::token_logp_entropy(xc.slice(1, 0, T), tokens.cpu(), 1.3);
    (lc.sum() - ec.sum()).backward();
    EXPECT_LE(max_abs(lg.cpu(), lc), 1e-5);
    EXPECT_LE(max_abs(eg.cpu(), ec), 1e-5);
    EXPECT_LE(max_abs(full.grad().cpu(), xc.grad()), 1e-5);
  }
}

}  // namespace
