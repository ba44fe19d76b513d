// What each block of a fused kernel leaves for the last block to merge, and the per-thread
// accumulator of the token kernel. The merged values are the generic algorithm's own partial
// types (algorithm/partials.hpp), so the single-thread steps that turn them into scalars and the
// result (batch_stats_fn, counts_fn, result_fn) are the generic ones, unchanged.
#pragma once

#include <cstdint>

#include "reco/algorithm/partials.hpp"
#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace fused {

// Kernel A (per group / per response): one slot per block.
struct response_block_partial {
  detail::batch_partial batch{};
  detail::group_partial groups{};
  detail::response_partial responses{};
};

// Kernel F (finalize): one slot per block.
struct finalize_block_partial {
  detail::response_partial responses{};
};

// Kernel B (tokens): the token partial plus the status bits of the value checks, which the
// fused path makes where the tokens are read (the generic path makes them in its response scan).
struct token_block_partial {
  detail::token_partial tokens{};
  std::uint32_t status = 0;
};

// One thread's running sums in kernel B. Counts are integers (exact, cheaper than doubles); the
// conversion to detail::token_partial happens once per thread.
struct token_accumulator {
  double policy = 0, kl = 0, entropy = 0;
  double ppo_kl = 0, ratio_sum = 0;
  double ratio_min = detail::huge_value, ratio_max = -detail::huge_value;
  double kl_sum = 0, entropy_sum = 0, entropy_kept_sum = 0;
  double var_sum[3] = {0, 0, 0};
  std::uint64_t valid = 0, policy_tokens = 0, clipped = 0, clip_low = 0, clip_high = 0, dual = 0;
  std::uint64_t var_count[3] = {0, 0, 0};
  std::uint32_t status = 0;

  RECO_HOST_DEVICE detail::token_partial to_partial() const {
    detail::token_partial p;
    p.policy = policy;
    p.kl = kl;
    p.entropy = entropy;
    p.valid = static_cast<double>(valid);
    p.policy_tokens = static_cast<double>(policy_tokens);
    p.clipped = static_cast<double>(clipped);
    p.clip_low = static_cast<double>(clip_low);
    p.clip_high = static_cast<double>(clip_high);
    p.dual = static_cast<double>(dual);
    p.ppo_kl = ppo_kl;
    p.ratio_sum = ratio_sum;
    p.ratio_min = ratio_min;
    p.ratio_max = ratio_max;
    p.kl_sum = kl_sum;
    p.entropy_sum = entropy_sum;
    p.entropy_kept_sum = entropy_kept_sum;
    for (int k = 0; k < 3; ++k) {
      p.var_sum[k] = var_sum[k];
      p.var_count[k] = static_cast<double>(var_count[k]);
    }
    return p;
  }
};

}  // namespace fused
RECO_NAMESPACE_END
