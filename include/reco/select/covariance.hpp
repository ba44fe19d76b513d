// Covariance-based token selection (Clip-Cov and KL-Cov, "The Entropy Mechanism of Reinforcement
// Learning for Reasoning Language Models", as verl's clip_cov / kl_cov policy losses run it).
// Each valid token t of the call is scored by
//   cov_t = (A_t - mean A) (logp_t - mean logp),   means over the call's valid tokens,
// a stop-gradient quantity (it only chooses tokens). Two uses:
//  - covariance_mode::clip (Clip-Cov): the candidates are the valid tokens whose PPO clip does
//    not bind (-A clamp(r) <= -A r) and with lb < cov < ub; k = max(1, floor(ratio N)) of them
//    (all, when there are at most k) lose their policy term (loss and gradient 0; they still
//    count in the denominator). verl picks the k by torch.randperm; here the choice is
//    reproducible: the k candidates with the smallest key, splitmix64(bits(seed) * C ^ place) >> 11,
//    place = (response << 32) ^ position in the response (ties: the earlier token wins).
//  - covariance_mode::kl (KL-Cov): the k = max(1, floor(ratio N)) valid tokens with the largest
//    cov (ties: the earlier token wins) get + coef |logp - old_logp| on their policy term.
// N is the number of valid tokens of the call, or of the step with a step plan (the means and
// the k then are the step's, and a token's place is its response's index in the step). The
// selection is computed on the host: CPU backends and the LibTorch adapter on CPU tensors; the
// CUDA paths reject it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "reco/component.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

enum class covariance_mode : std::uint8_t { clip, kl };
constexpr choice_labels<2> labels_of(covariance_mode) { return {{"clip", "kl"}}; }

struct covariance_selection {
  using role = roles::token_selector;
  struct params_type {
    covariance_mode mode = covariance_mode::kl;
    double ratio = 2e-4;  // selected fraction of the valid tokens, k = max(1, floor(ratio N)); in (0, 1]
    double lb = 1.0;      // clip mode: candidates have lb < cov < ub
    double ub = 5.0;
    double coef = 0.1;    // kl mode: weight of |logp - old_logp| on the selected tokens
    double seed = 0;      // clip mode: the reproducible subset (any finite value; its bits seed the hash)
  };
  params_type params{};
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("mode", p.mode);
    v("ratio", p.ratio);
    v("lb", p.lb);
    v("ub", p.ub);
    v("coef", p.coef);
    v("seed", p.seed);
  }

  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(params.ratio > 0 && params.ratio <= 1, name, "ratio", "must be in (0, 1]");
    check_param(!(params.lb != params.lb), name, "lb", "must not be NaN");
    check_param(!(params.ub != params.ub), name, "ub", "must not be NaN");
    check_param(params.lb < params.ub, name, "ub", "must be greater than lb");
    check_param(finite_param(params.coef) && params.coef >= 0, name, "coef", "must be finite and >= 0");
    check_param(finite_param(params.seed), name, "seed", "must be finite");
  }
  static constexpr bool active = true;
  static constexpr bool needs_entropy = false;
};

template <class S>
inline constexpr bool is_covariance_selection_v = std::is_same_v<S, covariance_selection>;

RECO_NAMESPACE_END
