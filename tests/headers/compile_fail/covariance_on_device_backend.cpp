// Clip-Cov / KL-Cov select in host memory: a call on a backend whose memory the host cannot
// address (as the generic reco::cuda) is refused at compile time, naming the backends that run it.
#define RECO_TEST_DEVICE_MEMORY
#include "declared_backend.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/token.hpp"
#include "reco/select/covariance.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::covariance_selection>
      o;
  reco::workspace<declared_backend> ws;
  o.run(declared_backend{}, reco::batch_view<float>{}, reco::gradients<float>{}, ws);
}
