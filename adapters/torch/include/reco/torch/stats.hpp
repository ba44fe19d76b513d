// The diagnostics of one objective call as a flat float64 array, so that they can live in a
// tensor on the device (no host synchronisation) and cross the torch.ops boundary. The order is
// fixed: stat_names()[k] names entry k. LibTorch-free, so device code can pack it.
#pragma once

#include <string>
#include <vector>

#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

inline constexpr int stats_size = 30;

// Entry k of a stats tensor is named stat_names()[k].
inline const std::vector<std::string>& stat_names() {
  static const std::vector<std::string> names = {
      "loss",           "policy_loss",        "kl_loss",           "entropy_loss",
      "clip_frac",      "clip_frac_low",      "clip_frac_high",    "dual_clip_frac",
      "ppo_kl",         "ratio_mean",         "ratio_min",         "ratio_max",
      "ref_kl_mean",    "entropy_mean",       "entropy_kept_mean", "kept_frac",
      "weight_mean",    "weight_min",         "weight_max",        "weight_cap_hits",
      "zero_std_group_frac", "advantage_mean", "advantage_std",    "token_variance_early",
      "token_variance_middle", "token_variance_late", "valid_tokens", "policy_tokens",
      "nonempty_responses", "status"};
  return names;
}

// Counts are stored as doubles: exact below 2^53.
RECO_HOST_DEVICE inline void pack_stats(const objective_result& r, double* out) {
  const diagnostics& d = r.stats;
  const double v[stats_size] = {r.loss,
                                r.policy_loss,
                                r.kl_loss,
                                r.entropy_loss,
                                d.clip_frac,
                                d.clip_frac_low,
                                d.clip_frac_high,
                                d.dual_clip_frac,
                                d.ppo_kl,
                                d.ratio_mean,
                                d.ratio_min,
                                d.ratio_max,
                                d.ref_kl_mean,
                                d.entropy_mean,
                                d.entropy_kept_mean,
                                d.kept_frac,
                                d.weight_mean,
                                d.weight_min,
                                d.weight_max,
                                static_cast<double>(d.weight_cap_hits),
                                d.zero_std_group_frac,
                                d.advantage_mean,
                                d.advantage_std,
                                d.token_variance[0],
                                d.token_variance[1],
                                d.token_variance[2],
                                static_cast<double>(d.valid_tokens),
                                static_cast<double>(d.policy_tokens),
                                static_cast<double>(d.nonempty_responses),
                                static_cast<double>(r.status)};
  for (int k = 0; k < stats_size; ++k) out[k] = v[k];
}

inline objective_result unpack_stats(const double* v) {
  objective_result r;
  diagnostics& d = r.stats;
  r.loss = v[0];
  r.policy_loss = v[1];
  r.kl_loss = v[2];
  r.entropy_loss = v[3];
  d.clip_frac = v[4];
  d.clip_frac_low = v[5];
  d.clip_frac_high = v[6];
  d.dual_clip_frac = v[7];
  d.ppo_kl = v[8];
  d.ratio_mean = v[9];
  d.ratio_min = v[10];
  d.ratio_max = v[11];
  d.ref_kl_mean = v[12];
  d.entropy_mean = v[13];
  d.entropy_kept_mean = v[14];
  d.kept_frac = v[15];
  d.weight_mean = v[16];
  d.weight_min = v[17];
  d.weight_max = v[18];
  d.weight_cap_hits = static_cast<index_t>(v[19]);
  d.zero_std_group_frac = v[20];
  d.advantage_mean = v[21];
  d.advantage_std = v[22];
  d.token_variance[0] = v[23];
  d.token_variance[1] = v[24];
  d.token_variance[2] = v[25];
  d.valid_tokens = static_cast<index_t>(v[26]);
  d.policy_tokens = static_cast<index_t>(v[27]);
  d.nonempty_responses = static_cast<index_t>(v[28]);
  r.status = static_cast<std::uint32_t>(v[29]);
  return r;
}

}  // namespace torch
RECO_NAMESPACE_END
