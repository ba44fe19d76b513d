// ReCo's expected-occurrence weight  w_i = 1 / (G_g * pbar_old(o_i)),  pbar_old the geometric-mean
// token probability of the response under the sampling policy, computed in log space:
//   log w_i = -log G_g - mean_t old_logp_it.
// The weight carries no gradient, is capped at w_max = 10 (paper; cap <= 0 disables it), and may
// then be normalised to mean 1 within the group or the batch (documented options; default none);
// the normalisations run in log space where the weights overflow. An uncapped, unnormalised
// weight beyond the double range is an error naming batch.old_logp.
// An empty response gets weight 0.
//
// "The sampling policy" is the one that generated the responses. With an inference engine
// (vLLM, SGLang) that is the rollout policy mu, whose log-probs differ from the trainer's
// recomputation old_logp; weight.sampling = rollout averages batch.rollout_logp instead of
// old_logp (pbar = pbar_mu), the default (old) keeps old_logp. The switch is explicit: rollout
// log-probs given with sampling = old, or sampling = rollout without them, are errors naming
// batch.rollout_logp. The ratio, clip and KL terms keep reading old_logp either way.
#pragma once

#include <cmath>

#include <string>

#include "reco/weight/common.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

// Whose log-probs the expected-count weight averages (see the top of this header).
enum class weight_sampling : std::uint8_t {
  old,      // batch.old_logp (logp when on-policy): the trainer's view of the sampling policy
  rollout,  // batch.rollout_logp: the inference engine that sampled the responses
};
constexpr choice_labels<2> labels_of(weight_sampling) { return {{"old", "rollout"}}; }

struct expected_count_weight {
  using role = roles::response_weighter;
  struct params_type {
    double cap = 10.0;  // w_max; <= 0 disables the cap (the paper's "no clipping" ablation)
    weight_normalisation normalise = weight_normalisation::none;
    weight_sampling sampling = weight_sampling::old;
  };
  params_type params{};
  // The fields settable by key ("<role>.<field>", reco/registry.hpp).
  template <class V>
  static void fields(params_type& p, V&& v) {
    v("cap", p.cap);
    v("normalise", p.normalise);
    v("sampling", p.sampling);
  }

  // Throws reco::error naming the first parameter out of range.
  void validate(const std::string& name) const {
    using detail::check_param;
    using detail::finite_param;
    check_param(!(params.cap != params.cap), name, "cap", "must not be NaN (<= 0 disables the cap)");
    check_param(static_cast<int>(params.sampling) <= 1, name, "sampling", "must be old or rollout");
  }

  static constexpr bool needs_old_logp_mean = true;
  static constexpr bool reads_response_weights = false;
  static constexpr bool is_uniform = false;
  static constexpr bool reads_group_size = true;  // G: the adapters require groups for it
  // Whether the mean is taken over batch.rollout_logp (which is then required).
  bool reads_rollout_logp() const { return params.sampling == weight_sampling::rollout; }

  RECO_HOST_DEVICE double raw(const response_context& r) const {
    if (r.length == 0 || r.group_size == 0) return 0.0;
    return ::exp(log_raw(r));
  }
  // The weight's log, finite where the weight itself overflows (mean old_logp below about -709):
  // the cap and the normalisations work from it.
  RECO_HOST_DEVICE double log_raw(const response_context& r) const {
    if (r.length == 0 || r.group_size == 0) return -HUGE_VAL;
    return -::log(static_cast<double>(r.group_size)) - r.mean_old_logp;
  }
  RECO_HOST_DEVICE double cap() const { return params.cap; }
  RECO_HOST_DEVICE weight_normalisation normalisation() const { return params.normalise; }
};

RECO_NAMESPACE_END
