// The named GRPO-family objectives and the ReCo paper's ablations. Each preset is an ordinary
// reco::objective whose constructor sets the published constants; every parameter stays
// adjustable afterwards (obj.clip.params.eps_high = ...). docs/presets.md lists each constant
// and its source.
//
// DAPO's dynamic sampling (group filter) and overlong reward shaping act on the batch, not on the
// loss: apply reco::filter_groups and reco::overlong_penalty (batch_ops/) before the call.
#pragma once

#include <type_traits>

#include "reco/advantage/dr_grpo.hpp"
#include "reco/advantage/gpg.hpp"
#include "reco/advantage/grpo.hpp"
#include "reco/aggregate/seq_mean_token_mean.hpp"
#include "reco/aggregate/seq_mean_token_sum_all.hpp"
#include "reco/aggregate/seq_mean_token_sum_norm.hpp"
#include "reco/aggregate/token_mean.hpp"
#include "reco/clip/no_clip.hpp"
#include "reco/clip/ppo_clip.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/kl/no_kl.hpp"
#include "reco/objective.hpp"
#include "reco/ratio/cispo.hpp"
#include "reco/ratio/dppo.hpp"
#include "reco/ratio/flipped.hpp"
#include "reco/ratio/reinforce.hpp"
#include "reco/ratio/sapo.hpp"
#include "reco/ratio/sequence.hpp"
#include "reco/ratio/token.hpp"
#include "reco/ratio/variance.hpp"
#include "reco/ratio/vespo.hpp"
#include "reco/select/covariance.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/weight/expected_count.hpp"
#include "reco/weight/uniform.hpp"

RECO_NAMESPACE_BEGIN
namespace presets {

namespace detail {
// verl's GRPO clip: eps 0.2 both sides plus the hard dual clip at c = 3.
template <class Obj>
void grpo_clip(Obj& o) {
  o.clip.params.eps_low = 0.2;
  o.clip.params.eps_high = 0.2;
  o.clip.params.dual_clip = dual_clip_mode::hard;
  o.clip.params.dual_clip_c = 3.0;
}
// DAPO's clip-higher: eps_low 0.2, eps_high 0.28, hard dual clip at c = 10 (DAPO recipe).
template <class Obj>
void dapo_clip(Obj& o) {
  o.clip.params.eps_low = 0.2;
  o.clip.params.eps_high = 0.28;
  o.clip.params.dual_clip = dual_clip_mode::hard;
  o.clip.params.dual_clip_c = 10.0;
}
// The paper's KL: k3 with beta = 0.001 (defaults of kl_penalty, restated for clarity).
template <class Obj>
void paper_kl(Obj& o) {
  o.kl.params.estimator = kl_estimator::k3;
  o.kl.params.beta = 0.001;
}
// The 80/20 rule as the official code runs it: exactly max(1, ceil(0.2 N)) tokens by top-k over
// the batch passed in, divided by all valid tokens (the paper's equation).
template <class Obj>
void top_20_percent(Obj& o) {
  o.select.params.rho = 0.2;
  o.select.params.rule = selection_rule::top_k;
  o.select.params.denominator = selection_denominator::valid;
}
// TRL's GRPOConfig defaults: advantages over std + 1e-4, no log-ratio clamp, epsilon 0.2 on
// both sides where a clip is used, beta 0 (no KL term).
template <class Obj>
void trl_defaults(Obj& o) {
  o.advantage.params.eps = 1e-4;
  if constexpr (std::is_same_v<typename Obj::ratio_type, token_ratio>) o.ratio.params.log_ratio_clamp = 0.0;
  if constexpr (std::is_same_v<typename Obj::clip_type, ppo_clip>) {
    o.clip.params.eps_low = 0.2;
    o.clip.params.eps_high = 0.2;
  }
}
}  // namespace detail

struct grpo : objective<grpo_advantage, token_ratio, ppo_clip, uniform_weight, seq_mean_token_mean, kl_penalty> {
  grpo() { detail::grpo_clip(*this); detail::paper_kl(*this); }
};

struct dr_grpo : objective<dr_grpo_advantage, token_ratio, ppo_clip, uniform_weight, seq_mean_token_sum_norm> {
  dr_grpo() {
    clip.params.eps_low = 0.2;
    clip.params.eps_high = 0.2;
  }
};

struct dapo : objective<grpo_advantage, token_ratio, ppo_clip, uniform_weight, token_mean> {
  dapo() { detail::dapo_clip(*this); }
};

struct gspo : objective<grpo_advantage, sequence_ratio, ppo_clip, uniform_weight, seq_mean_token_mean> {
  gspo() {
    clip.params.eps_low = 3e-4;
    clip.params.eps_high = 4e-4;
  }
};

struct cispo : objective<grpo_advantage, cispo_ratio, no_clip, uniform_weight, token_mean> {};

struct aspo : objective<grpo_advantage, flipped_ratio, ppo_clip, uniform_weight, token_mean, kl_penalty> {
  aspo() {
    clip.params.eps_low = 0.2;
    clip.params.eps_high = 0.2;
    clip.params.dual_clip = dual_clip_mode::soft;
    clip.params.dual_clip_c = 3.0;
    detail::paper_kl(*this);
  }
};

struct reco : objective<grpo_advantage, variance_ratio, ppo_clip, expected_count_weight, seq_mean_token_mean,
                        kl_penalty> {
  reco() {
    detail::grpo_clip(*this);
    weight.params.cap = 10.0;
    detail::paper_kl(*this);
  }
};

// The paper's "No clipping" ablation of the response-weight cap (Table response_clip).
struct reco_no_cap : reco {
  reco_no_cap() { weight.params.cap = 0.0; }
};

struct reco_response_only : objective<grpo_advantage, token_ratio, ppo_clip, expected_count_weight,
                                      seq_mean_token_mean, kl_penalty> {
  reco_response_only() {
    detail::grpo_clip(*this);
    weight.params.cap = 10.0;
    detail::paper_kl(*this);
  }
};

struct reco_token_only : objective<grpo_advantage, variance_ratio, ppo_clip, uniform_weight, seq_mean_token_mean,
                                   kl_penalty> {
  reco_token_only() { detail::grpo_clip(*this); detail::paper_kl(*this); }
};

struct dapo_reco : objective<grpo_advantage, variance_ratio, ppo_clip, expected_count_weight, token_mean> {
  dapo_reco() {
    detail::dapo_clip(*this);
    weight.params.cap = 10.0;
  }
};

struct rule_80_20 : objective<grpo_advantage, token_ratio, ppo_clip, uniform_weight, token_mean,
                              top_entropy_selection> {
  rule_80_20() { detail::dapo_clip(*this); detail::top_20_percent(*this); }
};

struct rule_80_20_reco : objective<grpo_advantage, variance_ratio, ppo_clip, expected_count_weight, token_mean,
                                   top_entropy_selection> {
  rule_80_20_reco() {
    detail::dapo_clip(*this);
    weight.params.cap = 10.0;
    detail::top_20_percent(*this);
  }
};

// TRL's loss types that reco's other presets do not spell (docs/peers.md).
// loss_type "bnpo": token_mean over the call's own tokens.
struct trl_bnpo : objective<grpo_advantage, token_ratio, ppo_clip, uniform_weight, token_mean> {
  trl_bnpo() { detail::trl_defaults(*this); }
};

// loss_type "luspo" with importance_sampling_level "sequence": each response's token sum over
// all responses of the call.
struct trl_luspo : objective<grpo_advantage, sequence_ratio, ppo_clip, uniform_weight, seq_mean_token_sum_all> {
  trl_luspo() { detail::trl_defaults(*this); }
};

// loss_type "vespo": the gamma-weighted REINFORCE surrogate, aggregated like "dapo" (pass the
// global token count in reco::normalisers for TRL's num_items_in_batch).
struct trl_vespo : objective<grpo_advantage, vespo_ratio, no_clip, uniform_weight, token_mean> {
  trl_vespo() { detail::trl_defaults(*this); }
};

// verl's loss_mode "gpg" with its adv_estimator "gpg" (GPG): -A logp, no ratio and no clip,
// token-mean. With given advantages and rollout IS weights as token weights it is also verl's
// REINFORCE loss (bypass mode's loss_type "reinforce").
struct gpg : objective<gpg_advantage, reinforce_ratio, no_clip, uniform_weight, token_mean> {};

// SAPO's soft gate (4/tau) sigmoid(tau (r - 1)) in place of the clip, tau 1 (A > 0) and 1.05
// (A <= 0), seq-mean-token-mean: verl's loss_mode "sapo" (which forces that aggregation) at its
// defaults; TRL's loss_type "sapo" is the peer preset trl_sapo.
struct sapo : objective<grpo_advantage, sapo_ratio, no_clip, uniform_weight, seq_mean_token_mean> {};

// verl's policy_loss.loss_mode "clip_cov" and "kl_cov" (Entropy-Mechanism paper) with verl's
// actor defaults: clip_ratio 0.2 both sides, no dual clip, no log-ratio clamp, token-mean;
// clip_cov_ratio 2e-4, clip_cov_lb 1, clip_cov_ub 5; kl_cov_ratio 2e-4, ppo_kl_coef 0.1.
struct clip_cov : objective<grpo_advantage, token_ratio, ppo_clip, uniform_weight, token_mean, covariance_selection> {
  clip_cov() {
    ratio.params.log_ratio_clamp = 0.0;
    clip.params.eps_low = 0.2;
    clip.params.eps_high = 0.2;
    clip.params.dual_clip = dual_clip_mode::off;
    select.params.mode = covariance_mode::clip;
    select.params.ratio = 2e-4;
    select.params.lb = 1.0;
    select.params.ub = 5.0;
  }
};

struct kl_cov : objective<grpo_advantage, token_ratio, no_clip, uniform_weight, token_mean, covariance_selection> {
  kl_cov() {
    ratio.params.log_ratio_clamp = 0.0;
    select.params.mode = covariance_mode::kl;
    select.params.ratio = 2e-4;
    select.params.coef = 0.1;
  }
};

// DPPO (verl's loss_mode "dppo_tv", with ratio.divergence = binary_kl "dppo_kl"): the truncated,
// detached ratio times -A logp inside a trust region on the token's probability, token-mean; the
// loss function's own defaults (eps 0.2, c = 20). verl's ActorConfig defaults are the peer
// presets verl_dppo_tv / verl_dppo_kl.
struct dppo : objective<grpo_advantage, dppo_ratio, no_clip, uniform_weight, token_mean> {};

}  // namespace presets
RECO_NAMESPACE_END
