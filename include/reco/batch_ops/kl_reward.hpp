// KL in the reward instead of the loss (verl's use_kl_in_reward for outcome rewards): each
// response's reward becomes s_i - beta * sum_t kl(logp_t, ref_logp_t) over its valid tokens,
// with the estimator and clamps of a reco::kl_penalty.
#pragma once

#include "reco/batch.hpp"
#include "reco/kl/kl_penalty.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
template <class T>
struct kl_reward_fn {
  token_layout layout;
  const T* logp;
  const T* ref;
  const std::uint8_t* mask;
  kl_penalty kl;
  T* rewards;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    double sum = 0;
    for (index_t t = layout.begin(i); t < layout.end(i); ++t)
      if (mask == nullptr || mask[t] != 0)
        sum += kl.eval(static_cast<double>(logp[t]), static_cast<double>(ref[t])).value;
    rewards[i] = static_cast<T>(static_cast<double>(rewards[i]) - kl.params.beta * sum);
  }
};
}  // namespace detail

// Reads batch.layout, batch.logp, batch.ref_logp and batch.mask; updates rewards in place.
template <class Backend, class T>
void subtract_kl_from_rewards(const Backend& be, const batch_view<T>& b, const kl_penalty& kl, span<T> rewards) {
  token_layout layout = b.layout;
  layout.tokens = b.logp.size();
  detail::require(b.ref_logp.size() == layout.tokens, "batch.ref_logp", "needs one entry per token");
  detail::require(rewards.size() == layout.responses, "rewards", "needs one entry per response");
  kl.validate("kl");
  be.for_each(layout.responses, detail::kl_reward_fn<T>{layout, b.logp.data(), b.ref_logp.data(),
                                                        b.mask.empty() ? nullptr : b.mask.data(), kl,
                                                        rewards.data()});
}

RECO_NAMESPACE_END
