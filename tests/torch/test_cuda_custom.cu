// A custom objective (not a preset) on CUDA tensors: the template path of policy_loss compiled by
// nvcc, with the entropy term's gradient, against the same call on the CPU.
#include <gtest/gtest.h>

#include "reco/reco.hpp"
#include "reco/torch/policy_loss.hpp"
#include "torch/test_batches.hpp"

namespace {

TEST(CudaCustom, EntropyBonusObjectiveMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  using obj_t = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
                                reco::expected_count_weight, reco::token_mean, reco::entropy_bonus>;
  obj_t obj;
  reco::torch::set_params(obj, {{"entropy.coef", 0.01}});
  const torch_test::batch b = torch_test::make_batch(5, true);
  reco::torch::policy_inputs cpu = torch_test::inputs(b, at::kDouble);
  cpu.entropy = cpu.entropy.clone().requires_grad_(true);
  reco::torch::policy_inputs gpu = cpu;
  gpu.logp = cpu.logp.detach().cuda().requires_grad_(true);
  gpu.entropy = cpu.entropy.detach().cuda().requires_grad_(true);
  for (at::Tensor* t : {&gpu.old_logp, &gpu.ref_logp, &gpu.mask, &gpu.offsets, &gpu.rewards, &gpu.group_offsets})
    *t = t->cuda();
  auto oc = reco::torch::policy_loss(obj, cpu);
  auto og = reco::torch::policy_loss(obj, gpu);
  oc.loss.backward();
  og.loss.backward();
  EXPECT_NEAR(og.loss.item<double>(), oc.loss.item<double>(), 1e-12);
  EXPECT_LE(torch_test::max_abs(gpu.logp.grad().cpu(), cpu.logp.grad()), 1e-12);
  EXPECT_LE(torch_test::max_abs(gpu.entropy.grad().cpu(), cpu.entropy.grad()), 1e-15);
}

}  // namespace
