// Plain-LibTorch references of the 13 presets, written from docs/conventions.md the way TRL and
// verl write their losses: padded [R, T] tensors, a float mask, masked means, stop-gradients with
// detach(), and autograd for the gradient. Everything runs in float64. The library is not used
// here; the tests compare it against these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace torch_ref {

enum class ratio_kind { token, variance, sequence, cispo, flipped };
enum class dual_kind { off, hard, soft };
enum class agg_kind { seq_mean_token_mean, token_mean, seq_mean_token_sum_norm };

struct config {
  bool scale_by_std = true;  // grpo (true) or Dr.GRPO (false) advantage
  ratio_kind ratio = ratio_kind::token;
  bool ppo = true;           // PPO clip (false: the ratio is self-clipped, CISPO)
  double eps_low = 0.2, eps_high = 0.2;
  dual_kind dual = dual_kind::off;
  double dual_c = 3.0;
  bool expected_weight = false;
  double cap = 0.0;          // 0: no cap
  agg_kind agg = agg_kind::seq_mean_token_mean;
  double kl_beta = 0.0;      // 0: no KL term (k3, clamped)
  bool top20 = false;        // top 20% entropy tokens by top-k, valid-token denominator
  double entropy_coef = 0.0; // entropy bonus (custom objectives only)
};

// The preset table of docs/presets.md with the constants of docs/conventions.md.
inline config preset(const std::string& name) {
  config c;
  auto grpo_clip = [&] { c.eps_low = c.eps_high = 0.2; c.dual = dual_kind::hard; c.dual_c = 3.0; };
  auto dapo_clip = [&] { c.eps_low = 0.2; c.eps_high = 0.28; c.dual = dual_kind::hard; c.dual_c = 10.0; };
  if (name == "grpo") { grpo_clip(); c.kl_beta = 1e-3; }
  else if (name == "dr_grpo") { c.scale_by_std = false; c.agg = agg_kind::seq_mean_token_sum_norm; }
  else if (name == "dapo") { dapo_clip(); c.agg = agg_kind::token_mean; }
  else if (name == "gspo") { c.ratio = ratio_kind::sequence; c.eps_low = 3e-4; c.eps_high = 4e-4; }
  else if (name == "cispo") { c.ratio = ratio_kind::cispo; c.ppo = false; c.agg = agg_kind::token_mean; }
  else if (name == "aspo") {
    c.ratio = ratio_kind::flipped; c.dual = dual_kind::soft; c.dual_c = 3.0; c.agg = agg_kind::token_mean; c.kl_beta = 1e-3;
  }
  else if (name == "reco") { c.ratio = ratio_kind::variance; grpo_clip(); c.expected_weight = true; c.cap = 10; c.kl_beta = 1e-3; }
  else if (name == "reco_no_cap") { c.ratio = ratio_kind::variance; grpo_clip(); c.expected_weight = true; c.kl_beta = 1e-3; }
  else if (name == "reco_response_only") { grpo_clip(); c.expected_weight = true; c.cap = 10; c.kl_beta = 1e-3; }
  else if (name == "reco_token_only") { c.ratio = ratio_kind::variance; grpo_clip(); c.kl_beta = 1e-3; }
  else if (name == "dapo_reco") {
    c.ratio = ratio_kind::variance; dapo_clip(); c.expected_weight = true; c.cap = 10; c.agg = agg_kind::token_mean;
  }
  else if (name == "rule_80_20") { dapo_clip(); c.agg = agg_kind::token_mean; c.top20 = true; }
  else if (name == "rule_80_20_reco") {
    c.ratio = ratio_kind::variance; dapo_clip(); c.expected_weight = true; c.cap = 10; c.agg = agg_kind::token_mean;
    c.top20 = true;
  }
  else throw std::invalid_argument("torch_ref::preset: unknown " + name);
  return c;
}

// A batch in the reference's padded form. For a packed batch the rows are the responses' ranges
// scattered into [R, L_max]; `flat_index` maps each padded slot to its packed position (-1 for
// slots beyond a response's range).
struct padded_batch {
  at::Tensor logp, old_logp, ref_logp, entropy, token_weights;  // [R, L] float64
  at::Tensor mask;                                              // [R, L] float64 0/1
  at::Tensor rewards;                                           // [R] float64
  std::vector<int64_t> group_offsets;
  int64_t max_length = 0;                                       // L_max of Dr.GRPO's constant normaliser
};

struct result {
  at::Tensor loss;   // 0-dim, differentiable with respect to the logp it was built from
  double policy = 0, kl = 0, entropy_part = 0;
  double clip_frac = 0, dual_frac = 0, ppo_kl = 0, ratio_mean = 0;
  double kept_frac = 0, weight_max = 0;
  int64_t cap_hits = 0, valid_tokens = 0, policy_tokens = 0;
};

inline at::Tensor masked_sum(const at::Tensor& x, const at::Tensor& m) { return (x * m).sum(); }

inline double item(const at::Tensor& t) { return t.item<double>(); }

// The loss of `c` on a padded batch; b.logp may require grad (and b.entropy, for the bonus).
inline result loss(const config& c, const padded_batch& b) {
  using at::Tensor;
  const Tensor m = b.mask;
  const int64_t R = b.logp.size(0);
  const Tensor n = m.sum(1);                      // valid tokens per response
  const Tensor nonempty = (n > 0).to(at::kDouble);
  const double R_prime = item(nonempty.sum());
  const double N_valid = item(m.sum());

  // Group advantages (std unbiased, eps 1e-6; a singleton group gets 0) and group sizes.
  std::vector<double> adv(static_cast<size_t>(R), 0.0), group_size(static_cast<size_t>(R), 0.0);
  for (size_t g = 0; g + 1 < b.group_offsets.size(); ++g) {
    const int64_t lo = b.group_offsets[g], hi = b.group_offsets[g + 1];
    for (int64_t i = lo; i < hi; ++i) group_size[static_cast<size_t>(i)] = static_cast<double>(hi - lo);
    if (hi - lo < 2) continue;
    const Tensor s = b.rewards.slice(0, lo, hi);
    const Tensor centred = s - s.mean();
    const Tensor a = c.scale_by_std ? centred / (s.std() + 1e-6) : centred;
    for (int64_t i = lo; i < hi; ++i) adv[static_cast<size_t>(i)] = a[i - lo].item<double>();
  }
  const Tensor A = at::tensor(adv, at::kDouble).unsqueeze(1);  // [R, 1]

  const Tensor logp = b.logp;
  const Tensor old = b.old_logp;
  const Tensor log_ratio = logp - old;
  // exp(logp - sg(logp)) is 1 in value and carries d/dlogp = 1: x_value * it has gradient x.
  const Tensor unit = at::exp(logp - logp.detach());

  Tensor x;       // the ratio the clip sees
  Tensor pg;      // per-token policy loss
  Tensor clipped = at::zeros_like(m);
  Tensor dual = at::zeros_like(m);
  if (c.ratio == ratio_kind::token || c.ratio == ratio_kind::flipped || c.ratio == ratio_kind::cispo) {
    x = at::exp(at::clamp(log_ratio, -20.0, 20.0));  // TRL/verl: the log-ratio clamped before exp
  } else if (c.ratio == ratio_kind::variance) {
    // ReCo: p(1 - sg p) / (p_old (1 - p_old)) in log space with a 1e-12 floor on each variance;
    // gradient weight = the ratio itself.
    auto log_var = [](const Tensor& q) { return at::clamp_min(q + at::log(-at::expm1(q)), std::log(1e-12)); };
    const Tensor lv = (log_var(logp.detach()) - log_var(old)).detach();
    const Tensor inside = (lv.abs() <= 20.0).to(at::kDouble);
    const Tensor value = at::exp(at::clamp(lv, -20.0, 20.0));
    x = value * (inside * unit + (1 - inside));
  } else {  // sequence (GSPO): exp(sg(mean_t log r) + logp - sg(logp)), log value capped at 10
    const Tensor seq = ((log_ratio.detach() * m).sum(1) / at::clamp_min(n, 1.0)).unsqueeze(1);
    const Tensor inside = (seq <= 10.0).to(at::kDouble);
    x = at::exp(at::clamp_max(seq, 10.0)) * (inside * unit + (1 - inside));
  }

  const double lo = 1.0 - c.eps_low, hi = 1.0 + c.eps_high;
  if (c.ratio == ratio_kind::cispo) {
    // CISPO: -sg(clip(r, 1 - 1, 1 + 5)) * A * logp; the gradient is never zeroed.
    const Tensor w = at::clamp(x, 0.0, 6.0).detach();
    pg = -w * A * logp;
    clipped = ((x < 0.0) | (x > 6.0)).to(at::kDouble) * (A != 0).to(at::kDouble);
  } else if (c.ratio == ratio_kind::flipped) {
    // ASPO: A > 0 tokens use rho / sg(rho)^2 with rho = min(r, 1 + eps_high) (value -A / rho,
    // gradient weight 1 / r); A <= 0 tokens are ordinary PPO tokens.
    const Tensor pos = (A > 0).to(at::kDouble);
    const Tensor clip_pos = (x > hi).to(at::kDouble);
    const Tensor pg_pos = at::where(x > hi, -A / hi, -A * x / (x.detach() * x.detach()));
    const Tensor pg_std = at::maximum(-A * x, -A * at::clamp(x, lo, hi));
    const Tensor clip_neg = (x < lo).to(at::kDouble) * (A < 0).to(at::kDouble);
    pg = pos * pg_pos + (1 - pos) * pg_std;
    clipped = pos * clip_pos + (1 - pos) * clip_neg;
  } else {
    // PPO: max(-A x, -A clip(x, 1 - eps_low, 1 + eps_high)).
    pg = at::maximum(-A * x, -A * at::clamp(x, lo, hi));
    clipped = ((A > 0) & (x > hi)).to(at::kDouble) + ((A < 0) & (x < lo)).to(at::kDouble);
  }
  if (c.dual == dual_kind::hard) {
    // verl: for A < 0 the loss is capped at -A c (zero gradient beyond).
    const Tensor cap = -A * c.dual_c;
    const Tensor fire = (A < 0) & (pg > cap);
    dual = fire.to(at::kDouble);
    pg = at::where(fire, cap.expand_as(pg), pg);
  } else if (c.dual == dual_kind::soft) {
    // ASPO: where the unclipped gradient weight exceeds c the loss becomes -A c logp.
    const Tensor omega = at::where(A > 0, 1.0 / x.detach(), x.detach());
    const Tensor fire = (clipped == 0) & (A != 0) & (omega > c.dual_c);
    dual = fire.to(at::kDouble);
    pg = at::where(fire, -A * c.dual_c * logp, pg);
  }

  // Response weights: w = min(1 / (G pi_old_bar), cap), pi_old_bar the geometric mean of p_old.
  Tensor w = at::ones({R, 1}, at::kDouble);
  int64_t cap_hits = 0;
  if (c.expected_weight) {
    const Tensor mean_old = (old * m).sum(1) / at::clamp_min(n, 1.0);
    Tensor raw = at::exp(-at::log(at::tensor(group_size, at::kDouble)) - mean_old) * nonempty;
    if (c.cap > 0) {
      cap_hits = (raw > c.cap).sum().item<int64_t>();
      raw = at::clamp_max(raw, c.cap);
    }
    w = raw.unsqueeze(1);
  }

  // Token selection: the top 20% entropies over the valid tokens (exactly max(1, ceil(0.2 N))
  // by a stable sort, so ties go to the earlier token).
  Tensor kept = m;
  if (c.top20) {
    const Tensor flat_valid = at::nonzero(m.reshape({-1}) > 0).squeeze(1);
    const Tensor h = b.entropy.detach().reshape({-1}).index_select(0, flat_valid);
    const int64_t N = h.numel();
    const int64_t k = N == 0 ? 0 : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(0.2 * N * (1 - 1e-12))));
    const Tensor order = std::get<1>(at::sort(h, /*stable=*/true, /*dim=*/0, /*descending=*/true));
    Tensor flat_kept = at::zeros({m.numel()}, at::kDouble);
    flat_kept.index_put_({flat_valid.index_select(0, order.slice(0, 0, k))}, 1.0);
    kept = flat_kept.view(m.sizes());
  }

  const Tensor tw = b.token_weights.defined() ? b.token_weights : at::ones_like(m);
  const Tensor policy_tokens = pg * w * tw * kept;
  auto aggregate = [&](const Tensor& per_token) -> Tensor {
    switch (c.agg) {
      case agg_kind::token_mean: return masked_sum(per_token, m) / N_valid;
      case agg_kind::seq_mean_token_sum_norm:
        return masked_sum(per_token, m) / (static_cast<double>(R) * static_cast<double>(b.max_length));
      case agg_kind::seq_mean_token_mean:
      default: return ((per_token * m).sum(1) / at::clamp_min(n, 1.0) * nonempty).sum() / R_prime;
    }
  };
  const Tensor policy = aggregate(policy_tokens);
  Tensor total = policy;
  result out;
  if (c.kl_beta > 0) {
    // k3 = exp(e) - e - 1 with e = -(logp - ref) clamped to [-20, 20], result clamped to [-10, 10].
    const Tensor e = at::clamp(-(logp - b.ref_logp), -20.0, 20.0);
    const Tensor k3 = at::clamp(at::exp(e) - e - 1, -10.0, 10.0);
    const Tensor kl = c.kl_beta * aggregate(k3);
    out.kl = item(kl);
    total = total + kl;
  }
  if (c.entropy_coef != 0) {
    const Tensor ent = -c.entropy_coef * aggregate(b.entropy);
    out.entropy_part = item(ent);
    total = total + ent;
  }
  out.loss = total;
  out.policy = item(policy);
  const Tensor pm = kept * m;
  const double n_policy = item(pm.sum());
  out.policy_tokens = static_cast<int64_t>(n_policy);
  out.valid_tokens = static_cast<int64_t>(N_valid);
  if (n_policy > 0) {
    out.clip_frac = item((clipped * pm).sum()) / n_policy;
    out.dual_frac = item((dual * pm).sum()) / n_policy;
    out.ppo_kl = item(((old - logp.detach()) * pm).sum()) / n_policy;
    out.ratio_mean = item((x.detach() * pm).sum()) / n_policy;
  }
  out.kept_frac = N_valid > 0 ? n_policy / N_valid : 0.0;
  out.cap_hits = cap_hits;
  out.weight_max = item((w.squeeze(1) * nonempty).max());
  return out;
}

}  // namespace torch_ref
