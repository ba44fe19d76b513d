// A response weighter where the clip policy belongs.
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/token.hpp"
#include "reco/weight/uniform.hpp"

int main() {
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::uniform_weight, reco::uniform_weight, reco::token_mean> o;
  (void)o;
}
