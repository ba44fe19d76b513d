// torch.ops.reco.*: the adapter as registered operators, for Python trainers.
//
//   torch.ops.load_library("build/adapters/torch/libreco_torch_ops.so")
//   loss, stats = torch.ops.reco.policy_loss("reco", logp, old_logp=old, ref_logp=ref, mask=mask,
//                                            rewards=rewards, group_offsets=groups,
//                                            overrides={"clip.eps_high": 0.28})
//   logp, entropy = torch.ops.reco.token_logp_entropy(logits, tokens, 0.7)
//   logp, entropy = torch.ops.reco.linear_logp_entropy(hidden, lm_head.weight, tokens, None, 0.7)
//
// Given advantages (verl, TRL): advantages=[R] (or token_advantages= shaped like logp, one per
// token: GAE's) instead of rewards=; the preset's estimator is replaced by them. A preset whose response weight reads G (reco, ...) also needs group_offsets,
// prompt_ids or group_size=G.
//
// Split steps (docs/distributed.md): plan_summary(preset, part, scale, summaries, tensors...)
// returns a micro-batch's summary of the plan's next stage (empty when the plan is complete); the
// caller sums them over micro-batches and all-reduces them, and appends the sum to `summaries`;
// planned_policy_loss(preset, part, scale, summaries, tensors...) is the micro-batch's share.
//
// The kernels are registered as CompositeImplicitAutograd: they run above the autograd layer, so
// the autograd functions inside them build the graph and backward works from Python.
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"
#include "reco/torch/token_logp_entropy.hpp"
#include "reco/torch/linear_logp_entropy.hpp"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace {

at::Tensor or_undefined(const c10::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

reco::torch::policy_inputs inputs_of(
    const at::Tensor& logp, const c10::optional<at::Tensor>& old_logp, const c10::optional<at::Tensor>& ref_logp,
    const c10::optional<at::Tensor>& entropy, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& offsets, const c10::optional<at::Tensor>& rewards,
    const c10::optional<at::Tensor>& advantages, const c10::optional<at::Tensor>& group_offsets,
    const c10::optional<at::Tensor>& prompt_ids, const c10::optional<at::Tensor>& token_weights,
    const c10::optional<at::Tensor>& response_weights, const c10::optional<at::Tensor>& rollout_logp,
    const c10::optional<at::Tensor>& token_advantages) {
  reco::torch::policy_inputs in;
  in.logp = logp;
  in.old_logp = or_undefined(old_logp);
  in.ref_logp = or_undefined(ref_logp);
  in.entropy = or_undefined(entropy);
  in.mask = or_undefined(mask);
  in.offsets = or_undefined(offsets);
  in.rewards = or_undefined(rewards);
  in.advantages = or_undefined(advantages);
  in.group_offsets = or_undefined(group_offsets);
  in.prompt_ids = or_undefined(prompt_ids);
  in.token_weights = or_undefined(token_weights);
  in.response_weights = or_undefined(response_weights);
  in.rollout_logp = or_undefined(rollout_logp);
  in.token_advantages = or_undefined(token_advantages);
  return in;
}

std::map<std::string, double> overrides_of(const c10::optional<c10::Dict<std::string, double>>& overrides) {
  std::map<std::string, double> ov;
  if (overrides.has_value())
    for (const auto& kv : *overrides) ov[kv.key()] = kv.value();
  return ov;
}

std::tuple<at::Tensor, at::Tensor> policy_loss_op(
    const std::string& preset, const at::Tensor& logp, const c10::optional<at::Tensor>& old_logp,
    const c10::optional<at::Tensor>& ref_logp, const c10::optional<at::Tensor>& entropy,
    const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& offsets,
    const c10::optional<at::Tensor>& rewards, const c10::optional<at::Tensor>& advantages,
    const c10::optional<at::Tensor>& group_offsets, const c10::optional<at::Tensor>& prompt_ids,
    const c10::optional<at::Tensor>& token_weights, const c10::optional<at::Tensor>& response_weights,
    const c10::optional<c10::Dict<std::string, double>>& overrides, int64_t global_tokens, int64_t global_responses,
    int64_t global_kept_tokens, int64_t global_kept_responses, bool host_stats, int64_t group_size,
    const c10::optional<at::Tensor>& rollout_logp, const c10::optional<at::Tensor>& token_advantages) {
  reco::torch::policy_inputs in =
      inputs_of(logp, old_logp, ref_logp, entropy, mask, offsets, rewards, advantages, group_offsets, prompt_ids,
                token_weights, response_weights, rollout_logp, token_advantages);
  in.group_size = group_size;
  in.normalisers.tokens = global_tokens;
  in.normalisers.responses = global_responses;
  in.normalisers.kept_tokens = global_kept_tokens;
  in.normalisers.kept_responses = global_kept_responses;
  in.host_stats = host_stats;
  std::map<std::string, double> ov;
  if (overrides.has_value())
    for (const auto& kv : *overrides) ov[kv.key()] = kv.value();
  reco::torch::policy_output out = reco::torch::policy_loss(preset, in, ov);
  return {out.loss, out.stats_tensor};
}

// A step plan without state: the summed summaries of the stages so far travel as tensors (the
// caller all-reduces them with torch.distributed); part = [step id, responses of the step,
// first response of this micro-batch, first group], scale: W under DDP averaging.
reco::step_part part_of(const std::vector<int64_t>& part, double scale) {
  if (part.size() != 4)
    reco::detail::fail("part", "must be [step id, responses of the step, first response, first group]");
  // Named before anything is allocated for them (the core checks them again as part.*).
  auto bound = [&](std::size_t k, const char* what, std::int64_t most) {
    if (part[k] < 0 || part[k] > most)
      reco::detail::fail("part[" + std::to_string(k) + "]", std::string("(") + what + ") is " +
                                                                std::to_string(part[k]) + "; it must lie in [0, " +
                                                                std::to_string(most) + "]");
  };
  bound(0, "the step id", std::numeric_limits<std::int64_t>::max());
  bound(1, "responses of the step", reco::detail::max_step_responses);
  bound(2, "first response", part[1]);
  bound(3, "first group", (std::int64_t{1} << 53) - 1);
  if (!(std::isfinite(scale) && scale > 0))
    reco::detail::fail("scale", "is " + std::to_string(scale) + "; it must be finite and > 0 (the world size under "
                                                                "DDP averaging, 1 for a plain sum)");
  reco::step_part p;
  p.step.id = static_cast<std::uint64_t>(part[0]);
  p.step.responses = part[1];
  p.step.scale = scale;
  p.first_response = part[2];
  p.first_group = part[3];
  return p;
}

// A part whose fields or scale fail their bounds while the step's size (part[1]) is known: it
// joins the step's collectives with its refusal (docs/distributed.md, "Failing alike") instead of
// raising before them; `refused` holds the error, `part` the step as far as it is known.
struct checked_part {
  reco::step_part part;
  c10::optional<reco::error> refused;
};
checked_part checked_part_of(const std::vector<int64_t>& part, double scale) {
  checked_part c;
  try {
    c.part = part_of(part, scale);
  } catch (const reco::error& e) {
    if (part.size() != 4 || part[1] < 0 || part[1] > reco::detail::max_step_responses) throw;  // size unknown
    c.refused = e;
    c.part.step.id = static_cast<std::uint64_t>(part[0]);
    c.part.step.responses = part[1];
    c.part.step.scale = 1.0;
  }
  return c;
}

at::Tensor plan_summary_op(const std::string& preset, const std::vector<int64_t>& part, double scale,
                           const std::vector<at::Tensor>& summaries, const at::Tensor& logp,
                           const c10::optional<at::Tensor>& old_logp, const c10::optional<at::Tensor>& ref_logp,
                           const c10::optional<at::Tensor>& entropy, const c10::optional<at::Tensor>& mask,
                           const c10::optional<at::Tensor>& offsets, const c10::optional<at::Tensor>& rewards,
                           const c10::optional<at::Tensor>& advantages, const c10::optional<at::Tensor>& group_offsets,
                           const c10::optional<at::Tensor>& prompt_ids, const c10::optional<at::Tensor>& token_weights,
                           const c10::optional<at::Tensor>& response_weights,
                           const c10::optional<c10::Dict<std::string, double>>& overrides, int64_t group_size,
                           const c10::optional<at::Tensor>& rollout_logp,
                           const c10::optional<at::Tensor>& token_advantages) {
  reco::torch::policy_inputs in =
      inputs_of(logp, old_logp, ref_logp, entropy, mask, offsets, rewards, advantages, group_offsets, prompt_ids,
                token_weights, response_weights, rollout_logp, token_advantages);
  in.group_size = group_size;
  const checked_part p = checked_part_of(part, scale);
  return reco::torch::plan_summary(preset, overrides_of(overrides), p.part, in, summaries,
                                   reco::torch::plan_passes::automatic, p.refused ? &*p.refused : nullptr);
}

std::tuple<at::Tensor, at::Tensor> planned_policy_loss_op(
    const std::string& preset, const std::vector<int64_t>& part, double scale, const std::vector<at::Tensor>& summaries,
    const at::Tensor& logp, const c10::optional<at::Tensor>& old_logp, const c10::optional<at::Tensor>& ref_logp,
    const c10::optional<at::Tensor>& entropy, const c10::optional<at::Tensor>& mask,
    const c10::optional<at::Tensor>& offsets, const c10::optional<at::Tensor>& rewards,
    const c10::optional<at::Tensor>& advantages, const c10::optional<at::Tensor>& group_offsets,
    const c10::optional<at::Tensor>& prompt_ids, const c10::optional<at::Tensor>& token_weights,
    const c10::optional<at::Tensor>& response_weights, const c10::optional<c10::Dict<std::string, double>>& overrides,
    int64_t group_size, const c10::optional<at::Tensor>& rollout_logp,
    const c10::optional<at::Tensor>& token_advantages) {
  reco::torch::policy_inputs in =
      inputs_of(logp, old_logp, ref_logp, entropy, mask, offsets, rewards, advantages, group_offsets, prompt_ids,
                token_weights, response_weights, rollout_logp, token_advantages);
  in.group_size = group_size;
  const checked_part p = checked_part_of(part, scale);
  reco::torch::policy_output out = reco::torch::policy_loss(preset, in, overrides_of(overrides), p.part, summaries,
                                                            p.refused ? &*p.refused : nullptr);
  return {out.loss, out.stats_tensor};
}

std::tuple<at::Tensor, at::Tensor> token_logp_entropy_op(const at::Tensor& logits, const at::Tensor& tokens,
                                                         double temperature,
                                                         const c10::optional<at::Tensor>& row_mask) {
  return reco::torch::token_logp_entropy(logits, tokens, temperature, or_undefined(row_mask));
}

std::tuple<at::Tensor, at::Tensor> linear_logp_entropy_op(const at::Tensor& hidden, const at::Tensor& weight,
                                                          const at::Tensor& tokens, const c10::optional<at::Tensor>& bias,
                                                          double temperature, const c10::optional<at::Tensor>& row_mask,
                                                          int64_t memory_budget, int64_t chunk_rows,
                                                          const c10::optional<std::string>& vocab_group,
                                                          bool keep_last_chunk) {
  if (memory_budget < 0) reco::detail::fail("memory_budget", "must be >= 0 (0: the default)");
  reco::torch::linear_logp_options o;
  o.temperature = temperature;
  o.memory_budget = static_cast<std::size_t>(memory_budget);
  o.chunk_rows = chunk_rows;
  o.keep_last_chunk = keep_last_chunk;
  // The process group by its registered name (torch.distributed's ProcessGroup.group_name), as
  // torch's functional collectives take it.
  if (vocab_group.has_value()) {
    if (!c10d::is_process_group_registered(*vocab_group))
      reco::detail::fail("vocab_group", "'" + *vocab_group + "' is no registered process group (pass the group itself, "
                                        "or its group_name, after torch.distributed made it)");
    o.vocab_group = c10d::resolve_process_group(*vocab_group);
  }
  return reco::torch::linear_logp_entropy(hidden, weight, tokens, or_undefined(bias), or_undefined(row_mask), o);
}

std::vector<std::string> stat_names_op() { return reco::torch::stat_names(); }
std::vector<std::string> presets_op() { return reco::torch::preset_names(); }
std::vector<std::string> composition_slots_op() { return reco::torch::composition_slots(); }
std::vector<std::string> choice_labels_op(const std::string& preset) { return reco::torch::choice_labels(preset); }
std::vector<std::string> as_composition_op(const std::string& preset) { return reco::torch::as_composition(preset); }
// The peer presets as a flat list: name, base, name, base, ...
std::vector<std::string> peer_presets_op() {
  std::vector<std::string> out;
  for (const auto& p : reco::torch::peer_presets()) {
    out.push_back(p.first);
    out.push_back(p.second);
  }
  return out;
}
std::vector<std::string> override_keys_op(const std::string& preset) { return reco::torch::override_keys(preset); }

}  // namespace

TORCH_LIBRARY(reco, m) {
  m.def(
      "policy_loss(str preset, Tensor logp, Tensor? old_logp=None, Tensor? ref_logp=None, Tensor? entropy=None, "
      "Tensor? mask=None, Tensor? offsets=None, Tensor? rewards=None, Tensor? advantages=None, "
      "Tensor? group_offsets=None, Tensor? prompt_ids=None, Tensor? token_weights=None, "
      "Tensor? response_weights=None, Dict(str, float)? overrides=None, int global_tokens=0, "
      "int global_responses=0, int global_kept_tokens=0, int global_kept_responses=0, bool host_stats=True, "
      "int group_size=0, Tensor? rollout_logp=None, Tensor? token_advantages=None) "
      "-> (Tensor, Tensor)",
      &policy_loss_op);
  m.def("plan_summary(str preset, int[] part, float scale, Tensor[] summaries, Tensor logp, Tensor? old_logp=None, Tensor? ref_logp=None, Tensor? entropy=None, "
      "Tensor? mask=None, Tensor? offsets=None, Tensor? rewards=None, Tensor? advantages=None, "
      "Tensor? group_offsets=None, Tensor? prompt_ids=None, Tensor? token_weights=None, "
      "Tensor? response_weights=None, Dict(str, float)? overrides=None, int group_size=0, "
      "Tensor? rollout_logp=None, Tensor? token_advantages=None) -> Tensor",
        &plan_summary_op);
  m.def("planned_policy_loss(str preset, int[] part, float scale, Tensor[] summaries, Tensor logp, Tensor? old_logp=None, Tensor? ref_logp=None, Tensor? entropy=None, "
      "Tensor? mask=None, Tensor? offsets=None, Tensor? rewards=None, Tensor? advantages=None, "
      "Tensor? group_offsets=None, Tensor? prompt_ids=None, Tensor? token_weights=None, "
      "Tensor? response_weights=None, Dict(str, float)? overrides=None, int group_size=0, "
      "Tensor? rollout_logp=None, Tensor? token_advantages=None) -> (Tensor, Tensor)",
        &planned_policy_loss_op);
  m.def("token_logp_entropy(Tensor logits, Tensor tokens, float temperature=1.0, Tensor? row_mask=None) "
        "-> (Tensor, Tensor)",
        &token_logp_entropy_op);
  m.def("linear_logp_entropy(Tensor hidden, Tensor weight, Tensor tokens, Tensor? bias=None, float temperature=1.0, "
        "Tensor? row_mask=None, int memory_budget=0, int chunk_rows=0, str? vocab_group=None, "
        "bool keep_last_chunk=True) -> (Tensor, Tensor)",
        &linear_logp_entropy_op);
  m.def("stat_names() -> str[]", &stat_names_op);
  m.def("presets() -> str[]", &presets_op);
  m.def("composition_slots() -> str[]", &composition_slots_op);
  m.def("choice_labels(str preset) -> str[]", &choice_labels_op);
  m.def("as_composition(str preset) -> str[]", &as_composition_op);
  m.def("peer_presets() -> str[]", &peer_presets_op);
  m.def("override_keys(str preset) -> str[]", &override_keys_op);
}
