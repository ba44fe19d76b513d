// A call of a split step (a step plan) on a backend whose memory the host cannot address and that
// does not copy the plan's slice itself (as the generic reco::cuda passes): refused at compile
// time, naming the backends that take a plan (reco::cpu, reco::cuda_fused).
#define RECO_TEST_DEVICE_MEMORY
#include "declared_backend.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/token.hpp"
#include "reco/step_plan.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> o;
  reco::workspace<declared_backend> ws;
  const reco::step_plan* plan = nullptr;
  o.run(declared_backend{}, reco::batch_view<float>{}, reco::gradients<float>{}, ws, *plan, reco::step_part{});
}
