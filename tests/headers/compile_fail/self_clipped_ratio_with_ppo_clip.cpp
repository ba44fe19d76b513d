// CISPO carries its own clipping: composing it with ppo_clip is rejected.
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/cispo.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::cispo_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> o;
  (void)o;
}
