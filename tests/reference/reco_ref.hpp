// Independent double-precision reference of the objectives `reco` implements.
//
// Written from docs/conventions.md (and docs/concepts.md for the gradient check) only; it includes
// nothing from include/reco. Everything is a straight loop over responses and tokens in double,
// so that each line can be checked against the definition it implements. It is slow on purpose.
//
// Readings chosen where the definitions leave room are marked "READING:" in reco_ref.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace reco_ref {

enum class advantage { grpo, dr_grpo, batch_std, rloo, reinforce_pp, opo, pass_at_k, gpg, given };
enum class singleton { zero, raw_score };
enum class ratio { token, sequence, variance, flipped, flipped_all, reinforce, cispo, sapo, gmpo, vespo, dppo };
enum class clip { none, ppo, entropy_split };
enum class dual { off, hard, soft };
enum class weight { uniform, expected_count, caller };
enum class weight_norm { none, group_mean, batch_mean };
enum class selection { all, top_k, quantile, cov_clip, cov_kl };
enum class denominator { valid, kept };
enum class aggregation { token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm, seq_mean_token_sum_all };
enum class kl { none, k1, abs, k2, k3 };

struct config {
  // Advantage (conventions: Advantages). adv_eps and scale_by_std apply to grpo and pass_at_k (adv_eps also to batch_std).
  advantage adv = advantage::grpo;
  double adv_eps = 1e-6;
  bool scale_by_std = true;
  singleton singleton_policy = singleton::zero;
  bool whiten_unbiased = true;  // reinforce_pp
  double whiten_eps = 1e-8;     // reinforce_pp

  // Ratio form (conventions: Ratio forms).
  ratio ratio_form = ratio::token;
  double log_ratio_clamp = 20;   // L; 0 disables
  double seq_max_log = 10;       // GSPO cap on the log sequence ratio
  double variance_floor = 1e-12; // floor on p(1 - p) (in log space)
  double cispo_eps_low = 1.0, cispo_eps_high = 5.0;
  double sapo_tau_pos = 1.0, sapo_tau_neg = 1.05;
  double gmpo_eps_low = 0.4, gmpo_eps_high = 0.4;
  // VESPO (TRL): phi = exp(lambda + k log w - lambda w), w = the response's product of token
  // ratios (clamped), (k, lambda) by the sign of A (A >= 0: pos).
  double vespo_k_pos = 2, vespo_lambda_pos = 3, vespo_k_neg = 3, vespo_lambda_neg = 2;
  // DPPO (verl dppo_tv / dppo_kl): -A sg(min(r, c)) logp inside a trust region on p = exp(logp):
  // TV p - p_old (A > 0: <= eps_high; else >= -eps_low), or the Bernoulli KL D (A > 0: D <= eps_high
  // or p <= p_old; else D <= eps_low or p >= p_old).
  bool dppo_binary_kl = false;
  double dppo_eps_low = 0.2, dppo_eps_high = 0.2, dppo_c = 20;

  // Clip (conventions: Clipping).
  clip clip_mode = clip::ppo;
  double eps_low = 0.2, eps_high = 0.2;
  dual dual_mode = dual::off;
  double dual_c = 3;
  double delta = 0;  // TRL's upper cap of the unclipped ratio (two-sided GRPO); 0 = off
  double split_eps_low = 0.4, split_eps_high = 0.4, split_percentile = 0.8;

  // Response weight (conventions: Response weights).
  weight weight_mode = weight::uniform;
  double weight_cap = 10;  // <= 0: no cap
  weight_norm weight_normalisation = weight_norm::none;

  // Token selection (conventions: Token selection).
  selection select = selection::all;
  double rho = 0.2;
  denominator denom = denominator::valid;
  bool use_given_cut = false;
  double given_cut = 0;
  std::int64_t given_ties = -1;  // top_k with a given cut: ties kept in position order; < 0: all
  // Clip-Cov / KL-Cov (docs/components/select.md): cov_t = (A_t - mean A)(logp_t - mean logp)
  // over the valid tokens at the frozen point; k = max(1, floor(cov_ratio N)).
  double cov_ratio = 2e-4, cov_lb = 1, cov_ub = 5, cov_coef = 0.1;
  double cov_seed = 0;  // clip: the subset is the k candidates with the smallest splitmix64(bits(seed) C ^ t)

  // Aggregation (conventions: Aggregation).
  aggregation agg = aggregation::seq_mean_token_mean;
  double sum_norm_constant = 0, sum_norm_max_length = 0;  // 0: R * batch.max_length

  // KL and entropy bonus (conventions: The loss).
  kl kl_mode = kl::none;
  double kl_beta = 0.001;
  bool kl_clamp = true;
  bool kl_straight_through = false;
  bool kl_importance_weighted = false;  // TRL use_bias_correction_kl: k * exp(logp - old_logp)
  bool entropy_bonus = false;
  double entropy_coef = 0.001;

  // Global normalisers (0 = local counts).
  std::int64_t norm_tokens = 0, norm_responses = 0, norm_kept_tokens = 0, norm_kept_responses = 0;
};

struct batch {  // R responses, N tokens, P groups
  std::vector<std::int64_t> token_begin, token_end;  // per response: its token range [begin, end)
  std::int64_t num_tokens = 0;                       // N
  std::int64_t max_length = 0;  // padded T, or for a packed batch the longest range
  std::vector<double> logp, old_logp;           // N each
  std::vector<double> ref_logp, entropy;        // N or empty
  std::vector<std::uint8_t> mask;               // N or empty (= every token in range valid)
  std::vector<double> token_weights;            // N or empty
  std::vector<double> rewards, advantages, response_weights;  // R each (last two may be empty)
  // advantage::given per token (N entries) instead of `advantages`: A_t in place of A_i at token t
  std::vector<double> token_advantages;
  std::vector<std::int64_t> group_offsets;      // P + 1
};

struct output {
  double loss = 0, policy_loss = 0, kl_loss = 0, entropy_loss = 0;
  std::vector<double> grad_logp, grad_entropy;  // N each; exactly 0 on invalid tokens
  double clip_frac = 0, clip_frac_low = 0, clip_frac_high = 0, dual_clip_frac = 0, ppo_kl = 0;
  double ratio_mean = 0, ratio_min = 0, ratio_max = 0, ref_kl_mean = 0, entropy_mean = 0,
         entropy_kept_mean = 0, kept_frac = 0;
  double weight_mean = 0, weight_min = 0, weight_max = 0;
  std::int64_t weight_cap_hits = 0;
  double zero_std_group_frac = 0, advantage_mean = 0, advantage_std = 0;
  double token_variance[3] = {0, 0, 0};
  std::int64_t valid_tokens = 0, policy_tokens = 0, nonempty_responses = 0;
  std::vector<double> advantages, weights;  // per response, final values
  std::vector<std::uint8_t> kept;           // per token, 1 = policy token (valid and selected)
};

// Loss, gradients and diagnostics. Throws std::invalid_argument on a malformed batch or a
// configuration that needs an input the batch lacks.
output evaluate(const batch& b, const config& c);

// The loss as a function of `logp` in which every stop-gradient quantity (the variance ratio's
// sg(p), the flipped ratio's sg(rho), CISPO's sg(clip(r)), the GSPO / GMPO sequence value, the
// soft dual clip's sg(c), the straight-through KL's sg(k - k2)) is evaluated at `frozen_logp`
// instead (docs/concepts.md, gradients). frozen_loss(b, c,
// b.logp, b.logp) == evaluate(b, c).loss, and d/dlogp_t of frozen_loss(b, c, logp + h e_t, logp)
// is evaluate(b, c).grad_logp[t]. b.logp itself is ignored.
double frozen_loss(const batch& b, const config& c, const std::vector<double>& logp,
                   const std::vector<double>& frozen_logp);

// grpo, dr_grpo, dapo, gspo, cispo, aspo, reco, reco_response_only, reco_token_only, dapo_reco,
// rule_80_20, rule_80_20_reco, reco_no_cap, trl_bnpo, trl_luspo, trl_vespo, clip_cov, kl_cov, dppo. Throws std::invalid_argument for another name.
config preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace reco_ref
