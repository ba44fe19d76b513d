// A user type that does not declare a role (nor the members of one) as the ratio form.
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/objective.hpp"
#include "reco/weight/uniform.hpp"

struct my_ratio {
  double eval(double logp) const { return logp; }
};

int main() {
  reco::objective<reco::grpo_advantage, my_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> o;
  (void)o;
}
