// torch.ops.reco.*: the batch operations (advantages, group filter, overlong shaping, KL in the
// reward, truncation mask, prompt groups), the evaluation metrics and the boxed-answer reward
// (reco/eval) as registered operators, for the Python package (python/reco/batch.py, python/reco/metrics.py).
//
// Kept apart from ops.cpp: nothing here runs an objective, so no preset's passes are instantiated
// (advantages by preset name only constructs the preset to read its estimator). Everything runs
// on the host: tensors on another device are copied in, and the batch operations' results go back
// to the device of their main input. Every bad input is a reco::error naming the Python argument
// (which reaches Python as ValueError), never a silent conversion.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "reco/backend/cpu.hpp"
#include "reco/batch_ops/estimate_advantages.hpp"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/batch_ops/kl_reward.hpp"
#include "reco/batch_ops/overlong_penalty.hpp"
#include "reco/batch_ops/prompt_groups.hpp"
#include "reco/batch_ops/rollout_importance_weights.hpp"
#include "reco/batch_ops/truncation_mask.hpp"
#include "reco/detail/moments.hpp"
#include "reco/eval/bleu.hpp"
#include "reco/eval/boxed_answer.hpp"
#include "reco/eval/distinct_n.hpp"
#include "reco/eval/kde.hpp"
#include "reco/eval/pass_at_k.hpp"
#include "reco/eval/path_uniqueness.hpp"
#include "reco/eval/token_variance.hpp"
#include "reco/registry.hpp"
#include "reco/result.hpp"

namespace {

using reco::index_t;
using reco::detail::fail;
using reco::detail::require;

// ---- argument checks -------------------------------------------------------------------------

// The library names a parameter "params.<field>"; the Python functions take the field itself.
template <class F>
auto python_names(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const reco::error& e) {
    const std::string& arg = e.argument();
    if (arg.rfind("params.", 0) != 0) throw;
    throw reco::error(arg.substr(7), e.message());
  }
}

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

void require_dim(const at::Tensor& t, const char* name, int64_t dim) {
  require(t.defined(), name, "is required");
  if (t.dim() != dim)
    fail(name, "must have " + std::to_string(dim) + " dimension(s), got shape " + std::string(c10::str(t.sizes())));
}

// A 1-D floating tensor as a contiguous host float64 tensor (values are checked by the caller).
at::Tensor host_doubles(const at::Tensor& t, const char* name) {
  require_dim(t, name, 1);
  if (!c10::isFloatingType(t.scalar_type()))
    fail(name, "must be a floating tensor (float64, float32, bfloat16 or float16), got " + dtype_name(t));
  return t.to(at::kCPU, at::kDouble).contiguous();
}

// A 1-D int64/int32 tensor as a contiguous host int64 tensor.
at::Tensor host_indices(const at::Tensor& t, const char* name) {
  require_dim(t, name, 1);
  if (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt)
    fail(name, "must be an int64 or int32 tensor, got " + dtype_name(t));
  return t.to(at::kCPU, at::kLong).contiguous();
}

template <class T>
reco::span<const T> span_of(const at::Tensor& t) {
  return reco::span<const T>(t.data_ptr<T>(), t.numel());
}

void require_finite(reco::span<const double> v, const char* name) {
  for (index_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) fail(name, "entry " + std::to_string(i) + " is " + std::to_string(v[i]) + " (not finite)");
}

// P + 1 offsets over `count` items: start at 0, never decrease, end at count.
void check_offsets(reco::span<const index_t> o, index_t count, const char* name, const char* items) {
  require(o.size() >= 1, name, "needs P + 1 entries (at least [0])");
  require(o[0] == 0, name, "must start at 0, got " + std::to_string(o[0]));
  for (index_t g = 1; g < o.size(); ++g)
    if (o[g] < o[g - 1])
      fail(name, "must not decrease: entry " + std::to_string(g) + " = " + std::to_string(o[g]) + " < " +
                     std::to_string(o[g - 1]));
  if (o[o.size() - 1] != count)
    fail(name, "must end at the number of " + std::string(items) + " (" + std::to_string(count) + "), got " +
                   std::to_string(o[o.size() - 1]));
}

// Group offsets from exactly one of group_offsets and prompt_ids.
std::vector<index_t> groups_of(const c10::optional<at::Tensor>& group_offsets, const c10::optional<at::Tensor>& prompt_ids,
                               index_t responses) {
  const bool has_offsets = group_offsets.has_value() && group_offsets->defined();
  const bool has_ids = prompt_ids.has_value() && prompt_ids->defined();
  if (has_offsets == has_ids) fail("group_offsets", "give exactly one of group_offsets and prompt_ids");
  if (has_ids) {
    const at::Tensor ids = host_indices(*prompt_ids, "prompt_ids");
    require(ids.numel() == responses, "prompt_ids",
            "has " + std::to_string(ids.numel()) + " entries, expected one per response (" +
                std::to_string(responses) + ")");
    return reco::group_offsets_from_prompt_ids(span_of<int64_t>(ids));
  }
  const at::Tensor o = host_indices(*group_offsets, "group_offsets");
  check_offsets(span_of<int64_t>(o), responses, "group_offsets", "responses");
  return std::vector<index_t>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
}

at::Tensor to_tensor(const std::vector<double>& v, const at::Device& device) {
  return at::tensor(c10::ArrayRef<double>(v), at::TensorOptions().dtype(at::kDouble)).to(device);
}
at::Tensor to_tensor(const std::vector<index_t>& v, const at::Device& device) {
  std::vector<int64_t> w(v.begin(), v.end());
  return at::tensor(c10::ArrayRef<int64_t>(w), at::TensorOptions().dtype(at::kLong)).to(device);
}

// ---- advantages ------------------------------------------------------------------------------

template <class Est>
void set_advantage_overrides(Est& est, const c10::optional<c10::Dict<std::string, double>>& overrides,
                             const std::string& what) {
  if (!overrides.has_value()) return;
  std::vector<reco::registry::field_info> fields;
  reco::registry::visit_fields(est, reco::registry::impl::field_lister{"advantage", &fields});
  std::string keys;
  for (const auto& f : fields) keys += (keys.empty() ? "" : ", ") + f.key;
  if (keys.empty()) keys = "none";
  for (const auto& kv : *overrides) {
    const std::string& key = kv.key();
    if (key.rfind("advantage.", 0) != 0)
      fail("overrides." + key, "advantages() reads only the advantage.* keys (" + what + ": " + keys + ")");
    const std::string field = key.substr(10);
    reco::registry::impl::field_setter s{field, key, kv.value()};
    reco::registry::visit_fields(est, s);
    if (!s.found) fail("overrides." + key, "is not a parameter of " + what + " (its keys: " + keys + ")");
  }
  reco::detail::validate_component(est, "advantage");
}

// The estimator's advantages (reco/batch_ops/estimate_advantages.hpp: the objective's two
// stages), with the op's input checks and errors.
template <class Est>
at::Tensor run_estimator(Est est, const std::string& what, const at::Tensor& rewards_in,
                         const c10::optional<at::Tensor>& group_offsets, const c10::optional<at::Tensor>& prompt_ids,
                         const c10::optional<at::Tensor>& lengths_in,
                         const c10::optional<c10::Dict<std::string, double>>& overrides) {
  constexpr bool reads_lengths = reco::registry::estimator_reads_lengths<Est>();
  set_advantage_overrides(est, overrides, what);
  const at::Tensor rewards = host_doubles(rewards_in, "rewards");
  const index_t R = rewards.numel();
  const reco::span<const double> s = span_of<double>(rewards);
  require_finite(s, "rewards");
  const std::vector<index_t> groups = groups_of(group_offsets, prompt_ids, R);

  std::vector<index_t> length(static_cast<std::size_t>(R), 0);
  const bool has_lengths = lengths_in.has_value() && lengths_in->defined();
  if (reads_lengths && !has_lengths)
    fail("lengths", "is required by " + what + " (valid tokens per response, e.g. mask.sum(-1))");
  if (!reads_lengths && has_lengths)
    fail("lengths", what + " does not read lengths (only opo and reinforce_pp do)");
  if (has_lengths) {
    const at::Tensor l = host_indices(*lengths_in, "lengths");
    require(l.numel() == R, "lengths",
            "has " + std::to_string(l.numel()) + " entries, expected one per response (" + std::to_string(R) + ")");
    for (index_t i = 0; i < R; ++i) {
      length[static_cast<std::size_t>(i)] = l.data_ptr<int64_t>()[i];
      require(length[static_cast<std::size_t>(i)] >= 0, "lengths", "entry " + std::to_string(i) + " is negative");
    }
  }

  std::vector<double> adv(static_cast<std::size_t>(R), 0.0);
  const std::uint32_t status = reco::estimate_advantages(est, s, reco::span<const index_t>(groups),
                                                         reco::span<const index_t>(length), reco::span<double>(adv));
  if (status & reco::singleton_group)
    fail("group_offsets", "a group has a single response and the estimator's singleton policy is 'error'");
  reco::throw_if_error(status);
  return to_tensor(adv, rewards_in.device());
}

at::Tensor advantages_op(const std::string& estimator, const at::Tensor& rewards,
                         const c10::optional<at::Tensor>& group_offsets, const c10::optional<at::Tensor>& prompt_ids,
                         const c10::optional<at::Tensor>& lengths,
                         const c10::optional<c10::Dict<std::string, double>>& overrides) {
  const std::string what = "estimator '" + estimator + "'";
  at::Tensor out;
  if (reco::registry::visit_estimator(estimator, [&](auto est) {
        out = run_estimator(est, what, rewards, group_offsets, prompt_ids, lengths, overrides);
      }))
    return out;
  for (const std::string& p : reco::registry::preset_names())
    if (p == estimator)
      return reco::registry::with_preset(estimator, [&](auto preset) {
        return run_estimator(preset.advantage, "preset '" + estimator + "'", rewards, group_offsets, prompt_ids,
                             lengths, overrides);
      });
  fail("estimator", "unknown estimator or preset '" + estimator +
                        "' (estimators: " + reco::registry::join(reco::registry::estimator_names()) + "; presets: " +
                        reco::registry::join(reco::registry::preset_names()) + ")");
}

// ---- the other batch operations --------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> filter_groups_op(const at::Tensor& rewards_in, const at::Tensor& group_offsets_in,
                                                    const std::string& rule, double low, double high,
                                                    bool keep_singletons) {
  const at::Tensor rewards = host_doubles(rewards_in, "rewards");
  require_finite(span_of<double>(rewards), "rewards");
  const at::Tensor offsets = host_indices(group_offsets_in, "group_offsets");
  check_offsets(span_of<int64_t>(offsets), rewards.numel(), "group_offsets", "responses");
  reco::group_filter_params p;
  if (rule == "nonzero_std") {
    p.rule = reco::group_filter_rule::nonzero_std;
  } else if (rule == "mean_in_range") {
    p.rule = reco::group_filter_rule::mean_in_range;
    require(std::isfinite(low) && std::isfinite(high), "low", "low and high must be finite");
    require(low < high, "low", "must be below high");
  } else {
    fail("rule", "unknown rule '" + rule + "' (nonzero_std or mean_in_range)");
  }
  p.low = low;
  p.high = high;
  p.keep_singletons = keep_singletons;
  std::vector<index_t> kept(static_cast<std::size_t>(rewards.numel())), kept_groups(static_cast<std::size_t>(offsets.numel()));
  reco::workspace<reco::cpu> ws;
  const reco::group_filter_counts n =
      reco::filter_groups(reco::cpu{}, span_of<double>(rewards), span_of<int64_t>(offsets), p,
                          reco::span<index_t>(kept), reco::span<index_t>(kept_groups), ws);
  kept.resize(static_cast<std::size_t>(n.responses));
  kept_groups.resize(static_cast<std::size_t>(n.groups + 1));
  return {to_tensor(kept, rewards_in.device()), to_tensor(kept_groups, rewards_in.device())};
}

at::Tensor overlong_penalty_op(const at::Tensor& rewards_in, const at::Tensor& lengths_in, double max_length,
                               double buffer, double factor) {
  const at::Tensor rewards = host_doubles(rewards_in, "rewards");
  require_finite(span_of<double>(rewards), "rewards");
  const at::Tensor lengths = host_indices(lengths_in, "lengths");
  require(lengths.numel() == rewards.numel(), "lengths",
          "has " + std::to_string(lengths.numel()) + " entries, expected one per reward (" +
              std::to_string(rewards.numel()) + ")");
  for (index_t i = 0; i < lengths.numel(); ++i)
    require(lengths.data_ptr<int64_t>()[i] >= 0, "lengths", "entry " + std::to_string(i) + " is negative");
  require(std::isfinite(buffer) && buffer > 0, "buffer", "must be finite and > 0");
  require(std::isfinite(max_length) && max_length >= buffer, "max_length", "must be finite and >= buffer");
  require(std::isfinite(factor) && factor >= 0, "factor", "must be finite and >= 0");
  at::Tensor out = rewards.clone();
  reco::overlong_params p{max_length, buffer, factor};
  reco::add_overlong_penalty(reco::cpu{}, span_of<int64_t>(lengths), p,
                             reco::span<double>(out.data_ptr<double>(), out.numel()));
  return out.to(rewards_in.device(), rewards_in.scalar_type());
}

// Per-token tensors of one layout: [R, T] (mask optional, same shape) or [N] packed with offsets.
struct token_tensors {
  reco::token_layout layout;
  at::Tensor offsets, mask;  // host int64 / uint8 (mask undefined: every token valid)
};
token_tensors layout_of(const at::Tensor& values, const char* name, const c10::optional<at::Tensor>& mask_in,
                        const c10::optional<at::Tensor>& offsets_in) {
  token_tensors t;
  require(values.defined(), name, "is required");
  if (offsets_in.has_value() && offsets_in->defined()) {
    require_dim(values, name, 1);
    t.offsets = host_indices(*offsets_in, "offsets");
    check_offsets(span_of<int64_t>(t.offsets), values.numel(), "offsets", "tokens");
    t.layout = reco::packed(span_of<int64_t>(t.offsets));
  } else {
    require_dim(values, name, 2);
    t.layout = reco::padded(values.size(0), values.size(1));
  }
  t.layout.tokens = values.numel();
  if (mask_in.has_value() && mask_in->defined()) {
    if (mask_in->scalar_type() != at::kBool && mask_in->scalar_type() != at::kByte)
      fail("mask", "must be a bool or uint8 tensor, got " + dtype_name(*mask_in));
    if (mask_in->sizes() != values.sizes())
      fail("mask", "shape " + std::string(c10::str(mask_in->sizes())) + " does not match " + name + " " +
                       std::string(c10::str(values.sizes())));
    t.mask = mask_in->to(at::kCPU, at::kByte).contiguous();
  }
  return t;
}

// tokens [R, T] (mask: same shape, optional) or [N] packed with offsets [R + 1].
at::Tensor mask_truncated_op(const at::Tensor& tokens_in, int64_t eos_token, const c10::optional<at::Tensor>& mask_in,
                             const c10::optional<at::Tensor>& offsets_in) {
  require(tokens_in.defined(), "tokens", "is required");
  if (tokens_in.scalar_type() != at::kLong && tokens_in.scalar_type() != at::kInt)
    fail("tokens", "must be an int64 or int32 tensor, got " + dtype_name(tokens_in));
  const at::Tensor tokens = tokens_in.to(at::kCPU, at::kLong).contiguous();
  const token_tensors t = layout_of(tokens_in, "tokens", mask_in, offsets_in);
  const reco::token_layout& layout = t.layout;
  const at::Tensor& mask = t.mask;
  at::Tensor out = at::zeros(tokens.sizes(), at::TensorOptions().dtype(at::kByte));
  reco::mask_truncated(reco::cpu{}, layout, span_of<int64_t>(tokens),
                       mask.defined() ? span_of<std::uint8_t>(mask) : reco::span<const std::uint8_t>(),
                       static_cast<int64_t>(eos_token), reco::span<std::uint8_t>(out.data_ptr<std::uint8_t>(), out.numel()));
  return out.to(tokens_in.device(), at::kBool);
}

// KL in the reward: s_i - beta * sum over valid tokens of k(logp, ref_logp).
at::Tensor kl_reward_op(const at::Tensor& rewards_in, const at::Tensor& logp_in, const at::Tensor& ref_in,
                        const c10::optional<at::Tensor>& mask_in, const c10::optional<at::Tensor>& offsets_in,
                        double beta, const std::string& estimator, bool clamp) {
  const at::Tensor rewards = host_doubles(rewards_in, "rewards");
  require_finite(span_of<double>(rewards), "rewards");
  const token_tensors t = layout_of(logp_in, "logp", mask_in, offsets_in);
  require(t.layout.responses == rewards.numel(), "rewards",
          "has " + std::to_string(rewards.numel()) + " entries, expected one per response (" +
              std::to_string(t.layout.responses) + ")");
  require(ref_in.defined() && ref_in.sizes() == logp_in.sizes(), "ref_logp", "must have the shape of logp");
  if (!c10::isFloatingType(logp_in.scalar_type())) fail("logp", "must be a floating tensor, got " + dtype_name(logp_in));
  if (!c10::isFloatingType(ref_in.scalar_type())) fail("ref_logp", "must be a floating tensor, got " + dtype_name(ref_in));
  const at::Tensor logp = logp_in.to(at::kCPU, at::kDouble).contiguous().view(-1);
  const at::Tensor ref = ref_in.to(at::kCPU, at::kDouble).contiguous().view(-1);
  const std::uint8_t* mask = t.mask.defined() ? t.mask.data_ptr<std::uint8_t>() : nullptr;
  for (index_t i = 0; i < t.layout.responses; ++i)
    for (index_t k = t.layout.begin(i); k < t.layout.end(i); ++k) {
      if (mask && mask[k] == 0) continue;
      const double a = logp.data_ptr<double>()[k], b = ref.data_ptr<double>()[k];
      if (!(std::isfinite(a) && a <= 0)) fail("logp", "a valid token is NaN, infinite or positive");
      if (!(std::isfinite(b) && b <= 0)) fail("ref_logp", "a valid token is NaN, infinite or positive");
    }
  reco::kl_penalty kl;
  require(std::isfinite(beta) && beta >= 0, "beta", "must be finite and >= 0");
  kl.params.beta = beta;
  kl.params.clamp = clamp;
  const auto labels = labels_of(reco::kl_estimator{});
  int which = -1;
  for (int k = 0; k < labels.size; ++k)
    if (estimator == labels.names[k]) which = k;
  if (which < 0) fail("estimator", "unknown KL estimator '" + estimator + "' (k1, abs, k2 or k3)");
  kl.params.estimator = static_cast<reco::kl_estimator>(which);
  reco::batch_view<double> b;
  b.layout = t.layout;
  b.logp = span_of<double>(logp);
  b.ref_logp = span_of<double>(ref);
  if (mask) b.mask = reco::span<const std::uint8_t>(mask, t.mask.numel());
  at::Tensor out = rewards.clone();
  reco::subtract_kl_from_rewards(reco::cpu{}, b, kl, reco::span<double>(out.data_ptr<double>(), out.numel()));
  return out.to(rewards_in.device(), rewards_in.scalar_type());
}

// The rollout importance-sampling correction: (token weights, keep mask, metrics) where the
// weights have old_logp's dtype and device and the keep mask is bool of its shape. Filters come
// as parallel lists (statistic names and their bounds); the metrics list follows
// python/reco/batch.py's ROLLOUT_METRICS.
std::tuple<at::Tensor, at::Tensor, std::vector<double>> rollout_correction_op(
    const at::Tensor& old_in, const at::Tensor& rollout_in, const std::vector<std::string>& statistics,
    at::ArrayRef<double> filter_lower, at::ArrayRef<double> filter_upper,
    const c10::List<bool>& negative_advantages_only, const c10::optional<at::Tensor>& mask_in,
    const c10::optional<at::Tensor>& offsets_in, const c10::optional<at::Tensor>& advantages_in,
    const std::string& level, const std::string& bound, double lower, double upper, double log_ratio_bound,
    bool normalise, double count_eps) {
  const token_tensors t = layout_of(old_in, "old_logp", mask_in, offsets_in);
  require(rollout_in.defined() && rollout_in.sizes() == old_in.sizes(), "rollout_logp",
          "must have the shape of old_logp");
  if (!c10::isFloatingType(old_in.scalar_type())) fail("old_logp", "must be a floating tensor, got " + dtype_name(old_in));
  if (!c10::isFloatingType(rollout_in.scalar_type()))
    fail("rollout_logp", "must be a floating tensor, got " + dtype_name(rollout_in));
  const at::Tensor old_lp = old_in.to(at::kCPU, at::kDouble).contiguous().view(-1);
  const at::Tensor roll_lp = rollout_in.to(at::kCPU, at::kDouble).contiguous().view(-1);
  reco::rollout_correction_params p;
  if (level == "none") p.level = reco::rollout_is_level::none;
  else if (level == "token") p.level = reco::rollout_is_level::token;
  else if (level == "sequence") p.level = reco::rollout_is_level::sequence;
  else fail("level", "unknown level '" + level + "' (none, token or sequence)");
  if (bound == "truncate") p.bound = reco::rollout_is_bound::truncate;
  else if (bound == "mask") p.bound = reco::rollout_is_bound::mask;
  else fail("bound", "unknown bound '" + bound + "' (truncate or mask)");
  p.lower = lower;
  p.upper = upper;
  p.log_ratio_bound = log_ratio_bound;
  p.normalise = normalise;
  p.count_eps = count_eps;
  const std::size_t nf = statistics.size();
  require(filter_lower.size() == nf && filter_upper.size() == nf && negative_advantages_only.size() == nf, "filters",
          "the statistic, lower, upper and negative_advantages_only lists differ in length");
  static const char* const names[] = {"token_k1",    "token_k2",    "token_k3",    "seq_sum_k1",
                                      "seq_sum_k2",  "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                      "seq_mean_k3", "seq_max_k1",  "seq_max_k2",  "seq_max_k3"};
  std::vector<reco::rollout_filter> filters(nf);
  for (std::size_t f = 0; f < nf; ++f) {
    int which = -1;
    for (int k = 0; k < 12; ++k)
      if (statistics[f] == names[k]) which = k;
    if (which < 0)
      fail("filters[" + std::to_string(f) + "].statistic",
           "unknown statistic '" + statistics[f] + "' (token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k1..k3)");
    filters[f].statistic = static_cast<reco::rollout_statistic>(which);
    filters[f].lower = filter_lower[f];
    filters[f].upper = filter_upper[f];
    filters[f].negative_advantages_only = negative_advantages_only.get(f);
  }
  at::Tensor adv;
  if (advantages_in.has_value() && advantages_in->defined()) {
    adv = host_doubles(*advantages_in, "advantages");
    require(adv.numel() == t.layout.responses, "advantages",
            "has " + std::to_string(adv.numel()) + " entries, expected one per response (" +
                std::to_string(t.layout.responses) + ")");
  }
  at::Tensor w = at::zeros({old_lp.numel()}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor keep = at::zeros({old_lp.numel()}, at::TensorOptions().dtype(at::kByte));
  const reco::rollout_correction_metrics m = python_names([&] {
    return reco::rollout_importance_weights<double>(
        t.layout, span_of<double>(old_lp), span_of<double>(roll_lp),
        t.mask.defined() ? span_of<std::uint8_t>(t.mask) : reco::span<const std::uint8_t>(),
        adv.defined() ? span_of<double>(adv) : reco::span<const double>(), p,
        reco::span<const reco::rollout_filter>(filters.data(), static_cast<index_t>(nf)),
        reco::span<double>(w.data_ptr<double>(), w.numel()),
        reco::span<std::uint8_t>(keep.data_ptr<std::uint8_t>(), keep.numel()));
  });
  std::vector<double> metrics = {static_cast<double>(m.valid_tokens), static_cast<double>(m.valid_responses),
                                 m.weight_mean, m.weight_min, m.weight_max, m.bounded_fraction, m.normaliser,
                                 m.rejected_token_fraction, m.rejected_response_fraction, m.k1_mean, m.k3_mean};
  return {w.view(old_in.sizes()).to(old_in.device(), old_in.scalar_type()),
          keep.view(old_in.sizes()).to(old_in.device(), at::kBool), metrics};
}

at::Tensor group_offsets_op(const at::Tensor& prompt_ids) {
  const at::Tensor ids = host_indices(prompt_ids, "prompt_ids");
  return to_tensor(reco::group_offsets_from_prompt_ids(span_of<int64_t>(ids)), prompt_ids.device());
}

std::tuple<at::Tensor, at::Tensor> group_by_prompt_op(const at::Tensor& prompt_ids) {
  const at::Tensor ids = host_indices(prompt_ids, "prompt_ids");
  const reco::prompt_grouping g = reco::group_by_prompt(span_of<int64_t>(ids));
  return {to_tensor(g.order, prompt_ids.device()), to_tensor(g.group_offsets, prompt_ids.device())};
}

// ---- metrics ---------------------------------------------------------------------------------

// One response against its reference (reco/eval/boxed_answer.hpp): (reward, found_box, extracted,
// normalised answer, normalised reference, numeric_match).
std::tuple<double, bool, std::string, std::string, std::string, bool> boxed_answer_reward_op(
    const std::string& response, const std::string& reference, double relative_tolerance) {
  require(std::isfinite(relative_tolerance) && relative_tolerance >= 0, "relative_tolerance",
          "must be finite and >= 0");
  reco::eval::boxed_answer_params p;
  p.relative_tolerance = relative_tolerance;
  const auto r = python_names([&] { return reco::eval::boxed_answer_reward(response, reference, p); });
  return {r.reward, r.found_box, r.extracted, r.normalised_answer, r.normalised_reference, r.numeric_match};
}

// Rewards of many responses, float64 [R].
at::Tensor boxed_answer_rewards_op(const std::vector<std::string>& responses, const std::vector<std::string>& references,
                                   double relative_tolerance) {
  require(references.size() == responses.size(), "references",
          "has " + std::to_string(references.size()) + " entries for " + std::to_string(responses.size()) +
              " responses");
  std::vector<double> out(responses.size());
  for (std::size_t i = 0; i < responses.size(); ++i) {
    try {
      out[i] = std::get<0>(boxed_answer_reward_op(responses[i], references[i], relative_tolerance));
    } catch (const reco::error& e) {
      if (e.argument() != "reference") throw;
      fail("references", "entry " + std::to_string(i) + ": " + std::string(e.what()));
    }
  }
  return to_tensor(out, at::kCPU);
}

double pass_at_k_op(int64_t n, int64_t c, int64_t k) { return reco::eval::pass_at_k(n, c, k); }

std::tuple<at::Tensor, at::Tensor> pass_at_k_curve_op(const at::Tensor& ns_in, const at::Tensor& cs_in,
                                                      const std::vector<int64_t>& ks) {
  const at::Tensor ns = host_indices(ns_in, "ns"), cs = host_indices(cs_in, "cs");
  const reco::eval::pass_at_k_curve_result r = reco::eval::pass_at_k_curve(span_of<int64_t>(ns), span_of<int64_t>(cs), ks);
  at::Tensor per = at::empty({static_cast<int64_t>(ks.size()), ns.numel()}, at::TensorOptions().dtype(at::kDouble));
  auto a = per.accessor<double, 2>();
  for (std::size_t j = 0; j < ks.size(); ++j)
    for (int64_t i = 0; i < ns.numel(); ++i) a[static_cast<int64_t>(j)][i] = r.per_problem[j][static_cast<std::size_t>(i)];
  return {to_tensor(r.mean, at::kCPU), per};
}

// A list of 1-D token tensors as token-id vectors.
std::vector<reco::eval::token_ids> sequences_of(const std::vector<at::Tensor>& seqs, const char* name) {
  std::vector<reco::eval::token_ids> out;
  out.reserve(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const at::Tensor& s = seqs[i];
    const std::string where = std::string("sequence ") + std::to_string(i) + " ";
    require(s.defined() && s.dim() == 1, name, where + "must be a 1-D tensor");
    if (s.scalar_type() != at::kLong && s.scalar_type() != at::kInt)
      fail(name, where + "must be int64 or int32, got " + dtype_name(s));
    const at::Tensor h = s.to(at::kCPU, at::kLong).contiguous();
    out.emplace_back(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
  }
  return out;
}

// Items split into prompts by prompt_offsets (P + 1 entries over the items).
template <class T>
std::vector<std::vector<T>> split_prompts(std::vector<T> items, const std::vector<int64_t>& prompt_offsets,
                                          const char* name) {
  check_offsets(reco::span<const index_t>(prompt_offsets.data(), static_cast<index_t>(prompt_offsets.size())),
                static_cast<index_t>(items.size()), "prompt_offsets", name);
  std::vector<std::vector<T>> out;
  for (std::size_t p = 0; p + 1 < prompt_offsets.size(); ++p)
    out.emplace_back(std::make_move_iterator(items.begin() + prompt_offsets[p]),
                     std::make_move_iterator(items.begin() + prompt_offsets[p + 1]));
  return out;
}

reco::eval::bleu_params bleu_params_of(int64_t max_order, const std::string& smoothing, double epsilon) {
  reco::eval::bleu_params p;
  require(max_order >= 1 && max_order <= reco::eval::bleu_max_order_limit, "max_order",
          "must be in [1, " + std::to_string(reco::eval::bleu_max_order_limit) + "], got " + std::to_string(max_order));
  p.max_order = static_cast<int>(max_order);
  if (smoothing == "method0") p.smoothing = reco::eval::bleu_smoothing::method0;
  else if (smoothing == "method1") p.smoothing = reco::eval::bleu_smoothing::method1;
  else fail("smoothing", "unknown smoothing '" + smoothing + "' (method0 or method1)");
  p.epsilon = epsilon;
  return p;
}

std::vector<at::Tensor> tokenise_whitespace_op(const std::vector<std::string>& texts) {
  std::vector<at::Tensor> out;
  for (const reco::eval::token_ids& ids : reco::eval::tokenise_whitespace(texts))
    out.push_back(at::tensor(c10::ArrayRef<int64_t>(ids), at::TensorOptions().dtype(at::kLong)));
  return out;
}

double sentence_bleu_op(const std::vector<at::Tensor>& references, const at::Tensor& hypothesis, int64_t max_order,
                        const std::string& smoothing, double epsilon) {
  const auto p = bleu_params_of(max_order, smoothing, epsilon);
  const auto hyp = sequences_of({hypothesis}, "hypothesis");
  return python_names([&] { return reco::eval::sentence_bleu(sequences_of(references, "references"), hyp[0], p); });
}

at::Tensor self_bleu_per_response_op(const std::vector<at::Tensor>& responses, int64_t max_order,
                                     const std::string& smoothing, double epsilon) {
  const auto p = bleu_params_of(max_order, smoothing, epsilon);
  return to_tensor(python_names([&] { return reco::eval::self_bleu_per_response(sequences_of(responses, "responses"), p); }),
                   at::kCPU);
}

// (mean over the prompts used, per-prompt values with NaN for a skipped prompt, prompts used)
std::tuple<double, at::Tensor, int64_t> self_bleu_among_correct_op(const std::vector<at::Tensor>& responses,
                                                                   const std::vector<int64_t>& prompt_offsets,
                                                                   const at::Tensor& correct_in, int64_t max_order,
                                                                   const std::string& smoothing, double epsilon) {
  const auto p = bleu_params_of(max_order, smoothing, epsilon);
  require_dim(correct_in, "correct", 1);
  if (correct_in.scalar_type() != at::kBool) fail("correct", "must be a bool tensor, got " + dtype_name(correct_in));
  require(correct_in.numel() == static_cast<int64_t>(responses.size()), "correct",
          "has " + std::to_string(correct_in.numel()) + " flags for " + std::to_string(responses.size()) + " responses");
  const at::Tensor correct = correct_in.to(at::kCPU).contiguous();
  std::vector<bool> flags(correct.data_ptr<bool>(), correct.data_ptr<bool>() + correct.numel());
  const auto prompts = split_prompts(sequences_of(responses, "responses"), prompt_offsets, "responses");
  const auto flag_prompts = split_prompts(std::vector<char>(flags.begin(), flags.end()), prompt_offsets, "responses");
  std::vector<std::vector<bool>> per(flag_prompts.size());
  for (std::size_t i = 0; i < per.size(); ++i) per[i].assign(flag_prompts[i].begin(), flag_prompts[i].end());
  const auto r = python_names([&] { return reco::eval::self_bleu_among_correct(prompts, per, p); });
  return {r.mean, to_tensor(r.per_prompt, at::kCPU), static_cast<int64_t>(r.prompts_used)};
}

double distinct_n_op(const std::vector<at::Tensor>& responses, const std::vector<int64_t>& prompt_offsets, int64_t n,
                     const std::string& scope, const std::string& denominator) {
  require(n >= 1 && n <= INT32_MAX, "n", "must be in [1, 2^31 - 1], got " + std::to_string(n));
  reco::eval::distinct_params p;
  if (scope == "pooled_per_prompt") p.scope = reco::eval::distinct_scope::pooled_per_prompt;
  else if (scope == "per_response") p.scope = reco::eval::distinct_scope::per_response;
  else fail("scope", "unknown scope '" + scope + "' (pooled_per_prompt or per_response)");
  if (denominator == "ngrams") p.denominator = reco::eval::distinct_denominator::ngrams;
  else if (denominator == "tokens") p.denominator = reco::eval::distinct_denominator::tokens;
  else fail("denominator", "unknown denominator '" + denominator + "' (ngrams or tokens)");
  const auto prompts = split_prompts(sequences_of(responses, "responses"), prompt_offsets, "responses");
  return python_names([&] { return reco::eval::distinct_n(prompts, static_cast<int>(n), p); });
}

double path_uniqueness_op(const std::vector<std::string>& rollouts, const std::vector<int64_t>& prompt_offsets,
                          int64_t prefix_code_points) {
  return reco::eval::path_uniqueness(split_prompts(rollouts, prompt_offsets, "rollouts"), prefix_code_points);
}

// (mean [3], standard_error [3], tokens [3], responses [3]) over early, middle, late thirds.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> token_variance_by_position_op(
    const at::Tensor& probabilities_in, const at::Tensor& offsets_in, bool log_probability) {
  const at::Tensor v = host_doubles(probabilities_in, "probabilities");
  const at::Tensor o = host_indices(offsets_in, "offsets");
  const auto r = reco::eval::token_variance_by_position(
      span_of<double>(v), span_of<int64_t>(o),
      log_probability ? reco::eval::probability_input::log_probability : reco::eval::probability_input::probability);
  auto d = [](const std::array<double, 3>& a) { return to_tensor(std::vector<double>(a.begin(), a.end()), at::kCPU); };
  auto i = [](const std::array<index_t, 3>& a) { return to_tensor(std::vector<index_t>(a.begin(), a.end()), at::kCPU); };
  return {d(r.mean), d(r.standard_error), i(r.tokens), i(r.responses)};
}

std::tuple<double, double, int64_t, int64_t> summary_tuple(const reco::eval::token_mean_summary& s) {
  return {s.token_mean, s.response_mean, static_cast<int64_t>(s.tokens), static_cast<int64_t>(s.responses)};
}

std::tuple<double, double, int64_t, int64_t> mean_token_entropy_op(const at::Tensor& entropy, const at::Tensor& offsets) {
  const at::Tensor v = host_doubles(entropy, "entropy");
  const at::Tensor o = host_indices(offsets, "offsets");
  return summary_tuple(reco::eval::mean_token_entropy(span_of<double>(v), span_of<int64_t>(o)));
}

std::tuple<double, double, int64_t, int64_t> mean_abs_kl_op(const at::Tensor& logp, const at::Tensor& ref_logp,
                                                            const at::Tensor& offsets) {
  const at::Tensor a = host_doubles(logp, "logp"), b = host_doubles(ref_logp, "ref_logp");
  const at::Tensor o = host_indices(offsets, "offsets");
  return summary_tuple(reco::eval::mean_abs_kl(span_of<double>(a), span_of<double>(b), span_of<int64_t>(o)));
}

at::Tensor mean_log_likelihood_per_response_op(const at::Tensor& logp, const at::Tensor& offsets) {
  const at::Tensor a = host_doubles(logp, "logp");
  const at::Tensor o = host_indices(offsets, "offsets");
  return to_tensor(reco::eval::mean_log_likelihood_per_response(span_of<double>(a), span_of<int64_t>(o)), at::kCPU);
}

// (grid, density, bandwidth, factor, sample_std)
std::tuple<at::Tensor, at::Tensor, double, double, double> gaussian_kde_op(const at::Tensor& samples_in,
                                                                          const std::string& rule, double adjust,
                                                                          int64_t grid_size, double cut) {
  const at::Tensor x = host_doubles(samples_in, "samples");
  reco::eval::kde_params p;
  if (rule == "scott") p.rule = reco::eval::kde_bandwidth_rule::scott;
  else if (rule == "silverman") p.rule = reco::eval::kde_bandwidth_rule::silverman;
  else fail("rule", "unknown bandwidth rule '" + rule + "' (scott or silverman)");
  p.adjust = adjust;
  p.grid_size = grid_size;
  p.cut = cut;
  const auto r = python_names([&] { return reco::eval::gaussian_kde(span_of<double>(x), p); });
  return {to_tensor(r.grid, at::kCPU), to_tensor(r.density, at::kCPU), r.bandwidth, r.factor, r.sample_std};
}

at::Tensor gaussian_kde_evaluate_op(const at::Tensor& samples_in, double bandwidth, const at::Tensor& points_in) {
  const at::Tensor x = host_doubles(samples_in, "samples"), pts = host_doubles(points_in, "points");
  require_finite(span_of<double>(pts), "points");
  require(std::isfinite(bandwidth) && bandwidth > 0, "bandwidth", "must be finite and > 0");
  return to_tensor(reco::eval::gaussian_kde_evaluate(span_of<double>(x), bandwidth, span_of<double>(pts)), at::kCPU);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(reco, m) {
  m.def("advantages(str estimator, Tensor rewards, Tensor? group_offsets=None, Tensor? prompt_ids=None, "
        "Tensor? lengths=None, Dict(str, float)? overrides=None) -> Tensor",
        &advantages_op);
  m.def("filter_groups(Tensor rewards, Tensor group_offsets, str rule=\"nonzero_std\", float low=0.0, "
        "float high=1.0, bool keep_singletons=True) -> (Tensor, Tensor)",
        &filter_groups_op);
  m.def("overlong_penalty(Tensor rewards, Tensor lengths, float max_length=20480.0, float buffer=4096.0, "
        "float factor=1.0) -> Tensor",
        &overlong_penalty_op);
  m.def("mask_truncated(Tensor tokens, int eos_token, Tensor? mask=None, Tensor? offsets=None) -> Tensor",
        &mask_truncated_op);
  m.def("kl_reward(Tensor rewards, Tensor logp, Tensor ref_logp, Tensor? mask=None, Tensor? offsets=None, "
        "float beta=0.001, str estimator=\"k3\", bool clamp=True) -> Tensor",
        &kl_reward_op);
  m.def("rollout_correction(Tensor old_logp, Tensor rollout_logp, str[] statistics, float[] filter_lower, "
        "float[] filter_upper, bool[] negative_advantages_only, Tensor? mask=None, Tensor? offsets=None, "
        "Tensor? advantages=None, str level=\"token\", str bound=\"truncate\", float lower=0.0, float upper=2.0, "
        "float log_ratio_bound=20.0, bool normalise=False, float count_eps=0.0) -> (Tensor, Tensor, float[])",
        &rollout_correction_op);
  m.def("group_offsets(Tensor prompt_ids) -> Tensor", &group_offsets_op);
  m.def("group_by_prompt(Tensor prompt_ids) -> (Tensor, Tensor)", &group_by_prompt_op);

  m.def("boxed_answer_reward(str response, str reference, float relative_tolerance=0.0001) "
        "-> (float, bool, str, str, str, bool)",
        &boxed_answer_reward_op);
  m.def("boxed_answer_rewards(str[] responses, str[] references, float relative_tolerance=0.0001) -> Tensor",
        &boxed_answer_rewards_op);
  m.def("pass_at_k(int n, int c, int k) -> float", &pass_at_k_op);
  m.def("pass_at_k_curve(Tensor ns, Tensor cs, int[] ks) -> (Tensor, Tensor)", &pass_at_k_curve_op);
  m.def("tokenise_whitespace(str[] texts) -> Tensor[]", &tokenise_whitespace_op);
  m.def("sentence_bleu(Tensor[] references, Tensor hypothesis, int max_order=4, str smoothing=\"method1\", "
        "float epsilon=0.1) -> float",
        &sentence_bleu_op);
  m.def("self_bleu_per_response(Tensor[] responses, int max_order=4, str smoothing=\"method1\", "
        "float epsilon=0.1) -> Tensor",
        &self_bleu_per_response_op);
  m.def("self_bleu_among_correct(Tensor[] responses, int[] prompt_offsets, Tensor correct, int max_order=4, "
        "str smoothing=\"method1\", float epsilon=0.1) -> (float, Tensor, int)",
        &self_bleu_among_correct_op);
  m.def("distinct_n(Tensor[] responses, int[] prompt_offsets, int n, str scope=\"pooled_per_prompt\", "
        "str denominator=\"ngrams\") -> float",
        &distinct_n_op);
  m.def("path_uniqueness(str[] rollouts, int[] prompt_offsets, int prefix_code_points=300) -> float",
        &path_uniqueness_op);
  m.def("token_variance_by_position(Tensor probabilities, Tensor offsets, bool log_probability=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        &token_variance_by_position_op);
  m.def("mean_token_entropy(Tensor entropy, Tensor offsets) -> (float, float, int, int)", &mean_token_entropy_op);
  m.def("mean_abs_kl(Tensor logp, Tensor ref_logp, Tensor offsets) -> (float, float, int, int)", &mean_abs_kl_op);
  m.def("mean_log_likelihood_per_response(Tensor logp, Tensor offsets) -> Tensor",
        &mean_log_likelihood_per_response_op);
  m.def("gaussian_kde(Tensor samples, str rule=\"scott\", float adjust=1.0, int grid_size=200, float cut=3.0) "
        "-> (Tensor, Tensor, float, float, float)",
        &gaussian_kde_op);
  m.def("gaussian_kde_evaluate(Tensor samples, float bandwidth, Tensor points) -> Tensor", &gaussian_kde_evaluate_op);
}
