// Two KL terms in the optional slots.
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/token.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::kl_penalty, reco::kl_penalty>
      o;
  (void)o;
}
