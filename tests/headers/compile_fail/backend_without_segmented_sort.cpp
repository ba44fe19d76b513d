// A backend that lacks one of the primitives the generic algorithm is written against (here the
// segmented sort): the call is refused naming the primitive (reco/backend/concept.hpp).
#define RECO_TEST_OMIT_SEGMENTED_SORT
#include "declared_backend.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/token.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> o;
  reco::workspace<declared_backend> ws;
  o.run(declared_backend{}, reco::batch_view<float>{}, reco::gradients<float>{}, ws);
}
