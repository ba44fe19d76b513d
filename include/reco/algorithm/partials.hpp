// The partial sums the generic passes reduce, and the per-call scalars they leave in the
// backend's memory (so that later passes read them there, without a host round trip).
#pragma once

#include <cmath>
#include <cstdint>

#include "reco/component.hpp"
#include "reco/detail/moments.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline constexpr double huge_value = 1.0e308;

// Per-response scratch arrays (structure of arrays in the workspace).
struct response_scratch {
  index_t* length = nullptr;     // valid tokens |o_i|
  index_t* kept = nullptr;       // policy tokens (selection)
  index_t* first = nullptr;      // first / last valid position (absolute token index)
  index_t* last = nullptr;
  double* old_mean = nullptr;    // mean old_logp over valid tokens
  double* adv = nullptr;         // A_i (given per token: their mean over the valid tokens)
  double* adv_m2 = nullptr;      // given per token: sum of (A_t - A_i)^2 over the valid tokens
  double* weight = nullptr;      // w_i
  double* log_weight = nullptr;  // log of w_i after the cap (batch-mean normalisation in log space)
  double* seq_log = nullptr;     // sequence log-ratio (sequence-scope ratios)
  double* entropy_q = nullptr;   // entropy quantile (entropy-split clip)
  std::uint32_t* status = nullptr;
  std::uint8_t* capped = nullptr;  // 1 when the weight hit its cap
  double* coef_policy = nullptr;   // aggregation coefficient of the policy term (null: per token)
  double* coef_valid = nullptr;    // ... of the KL / entropy terms
  index_t* group_size = nullptr;   // G of the response's group, where the token pass computes w_i

  // The arrays every objective uses, from a workspace carver (reco/workspace.hpp); the
  // optional ones are carved by the path that needs them.
  template <class Carver>
  void carve_common(Carver& c, index_t R) {
    length = c.template take<index_t>(R);
    first = c.template take<index_t>(R);
    last = c.template take<index_t>(R);
    old_mean = c.template take<double>(R);
    log_weight = c.template take<double>(R);
    adv = c.template take<double>(R);
    weight = c.template take<double>(R);
    status = c.template take<std::uint32_t>(R);
    capped = c.template take<std::uint8_t>(R);
  }
};

// The estimators' batch statistics from the moments of the rewards and of the group-stage
// advantages weighted by length: one definition for the objective's batch stage and for
// estimate_advantages (batch_ops/estimate_advantages.hpp).
RECO_HOST_DEVICE inline advantage_batch_stats advantage_stats_of(const moments& reward, double nonzero_rewards,
                                                                 const moments& token_adv) {
  advantage_batch_stats a;
  a.reward_count = reward.weight;
  a.reward_mean = reward.mean;
  a.reward_var = reward.variance_unbiased();
  a.nonzero_rewards = nonzero_rewards;
  a.token_count = token_adv.weight;
  a.token_mean = token_adv.mean;
  a.token_var_unbiased = token_adv.variance_unbiased();
  a.token_var_biased = token_adv.variance_biased();
  return a;
}

// Reduction over responses right after the group stage.
struct batch_partial {
  std::uint32_t status = 0;
  double nonempty = 0;        // R'
  double tokens = 0;          // N_valid
  double longest = 0;         // longest response range (packed L_max)
  moments reward{};           // rewards of all responses
  double nonzero_rewards = 0;
  moments token_adv{};        // group-stage values weighted by |o_i|
  double weight_sum = 0;      // over non-empty responses (batch normalisation)
  // The same sum as sum exp(log w - weight_log_max), for weights whose plain sum overflows.
  double weight_log_max = 0;
  double weight_log_sum = 0;  // 0: no non-empty response with a weight above 0

  // The fields that combine by a plain sum, OR or maximum, of a and b into r (r may be a).
  RECO_HOST_DEVICE static void merge_counts(batch_partial& r, const batch_partial& a, const batch_partial& b) {
    r.status = a.status | b.status;
    r.nonempty = a.nonempty + b.nonempty;
    r.tokens = a.tokens + b.tokens;
    r.longest = a.longest > b.longest ? a.longest : b.longest;
    r.nonzero_rewards = a.nonzero_rewards + b.nonzero_rewards;
    r.weight_sum = a.weight_sum + b.weight_sum;
  }

  RECO_HOST_DEVICE static batch_partial merge(const batch_partial& a, const batch_partial& b) {
    batch_partial r;
    merge_counts(r, a, b);
    r.reward = moments::merge(a.reward, b.reward);
    r.token_adv = moments::merge(a.token_adv, b.token_adv);
    if (a.weight_log_sum == 0 || b.weight_log_sum == 0) {
      const batch_partial& x = a.weight_log_sum == 0 ? b : a;
      r.weight_log_max = x.weight_log_max;
      r.weight_log_sum = x.weight_log_sum;
    } else if (a.weight_log_max - b.weight_log_max == 0) {  // equal and finite: exp(0) = 1, no exp needed
      r.weight_log_max = a.weight_log_max;
      r.weight_log_sum = a.weight_log_sum + b.weight_log_sum;
    } else {
      const double m = a.weight_log_max > b.weight_log_max ? a.weight_log_max : b.weight_log_max;
      r.weight_log_max = m;
      r.weight_log_sum = a.weight_log_sum * ::exp(a.weight_log_max - m) + b.weight_log_sum * ::exp(b.weight_log_max - m);
    }
    return r;
  }

  // The merge of partial_of(0) ... partial_of(n - 1) in two passes (sums, then the moments'
  // squared deviations about the totals' means, then the weights' log-sum-exp): the same values
  // as merging them one by one, up to rounding, without its chain of dependent divisions per
  // partial (the step plan reduces one partial per response of a step on one host thread).
  template <class PartialOf>
  static batch_partial reduce(index_t n, const PartialOf& partial_of) {
    batch_partial r;
    double reward_sum = 0, adv_sum = 0;
    for (index_t i = 0; i < n; ++i) {
      const batch_partial p = partial_of(i);
      merge_counts(r, r, p);
      r.reward.weight += p.reward.weight;
      reward_sum += p.reward.weight * p.reward.mean;
      r.token_adv.weight += p.token_adv.weight;
      adv_sum += p.token_adv.weight * p.token_adv.mean;
      if (p.weight_log_sum != 0 && (r.weight_log_sum == 0 || p.weight_log_max > r.weight_log_max)) {
        r.weight_log_max = p.weight_log_max;
        r.weight_log_sum = 1;  // a maximum was found; the sum comes in the second pass
      }
    }
    r.reward.mean = r.reward.weight > 0 ? reward_sum / r.reward.weight : 0.0;
    r.token_adv.mean = r.token_adv.weight > 0 ? adv_sum / r.token_adv.weight : 0.0;
    const bool logs = r.weight_log_sum != 0;
    r.weight_log_sum = 0;
    for (index_t i = 0; i < n; ++i) {
      const batch_partial p = partial_of(i);
      if (p.reward.weight > 0) {
        const double d = p.reward.mean - r.reward.mean;
        r.reward.m2 += p.reward.m2 + p.reward.weight * d * d;
      }
      if (p.token_adv.weight > 0) {
        const double d = p.token_adv.mean - r.token_adv.mean;
        r.token_adv.m2 += p.token_adv.m2 + p.token_adv.weight * d * d;
      }
      if (logs && p.weight_log_sum != 0) {
        const double shift = p.weight_log_max - r.weight_log_max;  // <= 0
        r.weight_log_sum += shift == 0 ? p.weight_log_sum : p.weight_log_sum * ::exp(shift);
      }
    }
    return r;
  }
};

struct group_partial {
  std::uint32_t status = 0;
  double zero_std = 0;
  RECO_HOST_DEVICE static group_partial merge(const group_partial& a, const group_partial& b) {
    return {a.status | b.status, a.zero_std + b.zero_std};
  }
};

// Reduction over responses once advantages, weights and kept counts are final.
struct response_partial {
  double kept_tokens = 0;
  double kept_nonempty = 0;
  double weight_count = 0;
  double weight_sum = 0;
  double weight_min = huge_value;
  double weight_max = -huge_value;
  double cap_hits = 0;
  moments adv{};  // final advantages weighted by |o_i| (token-weighted statistics)
  RECO_HOST_DEVICE static response_partial merge(const response_partial& a, const response_partial& b) {
    response_partial r;
    r.adv = moments::merge(a.adv, b.adv);
    r.kept_tokens = a.kept_tokens + b.kept_tokens;
    r.kept_nonempty = a.kept_nonempty + b.kept_nonempty;
    r.take_weights(a);
    r.merge_weights(b);
    return r;
  }
  // The weight fields of w in place of this partial's, and merged into them.
  RECO_HOST_DEVICE void take_weights(const response_partial& w) {
    weight_count = w.weight_count;
    weight_sum = w.weight_sum;
    weight_min = w.weight_min;
    weight_max = w.weight_max;
    cap_hits = w.cap_hits;
  }
  RECO_HOST_DEVICE void merge_weights(const response_partial& w) {
    weight_count += w.weight_count;
    weight_sum += w.weight_sum;
    weight_min = weight_min < w.weight_min ? weight_min : w.weight_min;
    weight_max = weight_max > w.weight_max ? weight_max : w.weight_max;
    cap_hits += w.cap_hits;
  }
};

// Counts of the selection's population.
struct cut_partial {
  double greater = 0;
  double equal = 0;
  RECO_HOST_DEVICE static cut_partial merge(const cut_partial& a, const cut_partial& b) {
    return {a.greater + b.greater, a.equal + b.equal};
  }
};

// Reduction over tokens: the loss parts and the token diagnostics.
struct token_partial {
  double policy = 0, kl = 0, entropy = 0;
  double valid = 0, policy_tokens = 0;
  double clipped = 0, clip_low = 0, clip_high = 0, dual = 0;
  double ppo_kl = 0, ratio_sum = 0, ratio_min = huge_value, ratio_max = -huge_value;
  double kl_sum = 0, entropy_sum = 0, entropy_kept_sum = 0;
  double var_sum[3] = {0, 0, 0};
  double var_count[3] = {0, 0, 0};
  std::uint32_t status = 0;  // value checks the token pass made (a host backend's call: token_fn::checks)

  RECO_HOST_DEVICE static token_partial merge(const token_partial& a, const token_partial& b) {
    token_partial r;
    r.status = a.status | b.status;
    r.policy = a.policy + b.policy;
    r.kl = a.kl + b.kl;
    r.entropy = a.entropy + b.entropy;
    r.valid = a.valid + b.valid;
    r.policy_tokens = a.policy_tokens + b.policy_tokens;
    r.clipped = a.clipped + b.clipped;
    r.clip_low = a.clip_low + b.clip_low;
    r.clip_high = a.clip_high + b.clip_high;
    r.dual = a.dual + b.dual;
    r.ppo_kl = a.ppo_kl + b.ppo_kl;
    r.ratio_sum = a.ratio_sum + b.ratio_sum;
    r.ratio_min = a.ratio_min < b.ratio_min ? a.ratio_min : b.ratio_min;
    r.ratio_max = a.ratio_max > b.ratio_max ? a.ratio_max : b.ratio_max;
    r.kl_sum = a.kl_sum + b.kl_sum;
    r.entropy_sum = a.entropy_sum + b.entropy_sum;
    r.entropy_kept_sum = a.entropy_kept_sum + b.entropy_kept_sum;
    for (int k = 0; k < 3; ++k) {
      r.var_sum[k] = a.var_sum[k] + b.var_sum[k];
      r.var_count[k] = a.var_count[k] + b.var_count[k];
    }
    return r;
  }
};

template <class Acc>
struct merge_fn {
  RECO_HOST_DEVICE Acc operator()(const Acc& a, const Acc& b) const { return Acc::merge(a, b); }
};

// Everything one call computes before the token pass, in the backend's memory.
struct objective_scalars {
  batch_partial batch{};
  group_partial groups{};
  response_partial responses{};
  advantage_batch_stats adv_stats{};
  double weight_scale = 1;          // batch-mean weight normalisation factor
  double weight_log_shift = 0;      // ... in log space, where the plain weight sum overflows
  std::uint32_t weight_log_space = 0;
  aggregation_counts valid{};       // counts for the KL / entropy terms
  aggregation_counts policy{};      // counts for the policy term
  // token selection
  index_t select_ranks[2] = {0, 0};
  double select_values[2] = {0, 0};
  index_t select_k = 0;
  entropy_cut cut{};
  cut_partial cut_counts{};
  std::uint32_t cut_counted = 0;  // 1: cut_counts hold the counts for cut (set by compute_cut)
  std::uint32_t status = 0;
  std::uint32_t norm_status = 0;  // global normalisers below the local counts (set by counts_fn)
};

struct init_scalars_fn {
  objective_scalars* s;
  RECO_HOST_DEVICE void operator()(index_t) const { *s = objective_scalars{}; }
};

}  // namespace detail
RECO_NAMESPACE_END
