// Control for the compile-fail tests: a well-formed objective, and a call of it on a backend that
// declares every primitive, compile without a diagnostic.
#include "declared_backend.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/variance.hpp"
#include "reco/weight/expected_count.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::expected_count_weight,
                  reco::token_mean, reco::kl_penalty>
      o;
  static_assert(reco::is_backend_v<declared_backend>);
  reco::workspace<declared_backend> ws;
  o.run(declared_backend{}, reco::batch_view<float>{}, reco::gradients<float>{}, ws);
}
