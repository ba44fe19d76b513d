// reco::torch::build_step_plan: the step plan of a rank's micro-batches over a c10d process group.
#include "reco/torch/step_plan.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "reco/torch/detail/plan_token_passes.hpp"
#include "presets.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace {

using reco::detail::fail;

// Runs one collective and waits for it; a failure (a rank that never joins and the process
// group's timeout passes, a closed connection) becomes a reco::error naming the process group.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    fail("process_group", what + " failed (did every rank call build_step_plan for this step within the process "
                                 "group's timeout, and is every rank alive?): " + e.what());
  }
}

// Element-wise sum over ranks, in place. The collective runs on `device`: the step's tensors' (a
// CUDA device for NCCL, which takes CUDA tensors only; Gloo takes either).
void sum_over_ranks(const c10::intrusive_ptr<c10d::ProcessGroup>& group, reco::step_summary& s, const std::string& what,
                    int& count, const at::Device& device) {
  if (!group) return;
  if (device.is_cpu()) {
    std::vector<at::Tensor> ts{at::from_blob(s.values.data(), {static_cast<std::int64_t>(s.values.size())},
                                             at::TensorOptions().dtype(at::kDouble))};
    wait_for(group->allreduce(ts), what);  // in place
  } else {
    std::vector<at::Tensor> ts{detail::float64_tensor_on(s.values, device)};
    wait_for(group->allreduce(ts), what);
    const at::Tensor host = detail::to_host(ts[0]);  // after the collective on the current stream
    std::memcpy(s.values.data(), host.data_ptr<double>(), s.values.size() * sizeof(double));
  }
  ++count;
}

// A micro-batch whose tensors are on a CUDA device, as the plan's host steps read it (the plan is
// made on the host; the calls of the step then run on the device with it): copies of the
// per-response inputs and the layout, and, unless the token passes run on the device
// (`tokens_stay`), of the mask and the per-token values the plan reads (ops.reads_*); the other
// per-token inputs become host tensors of their shape, never filled (the plan checks their shapes
// only: a micro-batch for a plan is converted without value checks, which its call makes).
policy_inputs on_host(const policy_inputs& in, const detail::plan_ops& ops, bool tokens_stay) {
  policy_inputs h = in;
  auto copy = [](at::Tensor& t) {
    if (t.defined()) t = t.detach().to(at::kCPU);
  };
  auto shape_only = [](at::Tensor& t) {
    if (t.defined()) t = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()));
  };
  for (at::Tensor* t : {&h.offsets, &h.rewards, &h.advantages, &h.token_advantages, &h.group_offsets, &h.prompt_ids,
                        &h.response_weights, &h.rollout_logp})
    copy(*t);
  const bool old_mean = !tokens_stay && ops.reads_old_mean && !in.rollout_logp.defined();
  if (tokens_stay) shape_only(h.mask); else copy(h.mask);
  if (old_mean && !in.old_logp.defined()) copy(h.logp); else shape_only(h.logp);
  if (old_mean) copy(h.old_logp); else shape_only(h.old_logp);
  if (ops.reads_entropy && !tokens_stay) copy(h.entropy); else shape_only(h.entropy);
  shape_only(h.ref_logp);
  shape_only(h.token_weights);
  h.plan = nullptr;
  return h;
}

// The device of a step's micro-batches (their logp); all must be on one device.
at::Device device_of(const std::vector<policy_inputs>& micro_batches) {
  if (micro_batches.empty()) fail("micro_batches", "needs at least one micro-batch (an empty one is fine)");
  const at::Device d = micro_batches[0].logp.defined() ? micro_batches[0].logp.device() : at::Device(at::kCPU);
  for (std::size_t j = 1; j < micro_batches.size(); ++j)
    if (micro_batches[j].logp.defined() && micro_batches[j].logp.device() != d)
      fail("micro_batches", "are on different devices (" + d.str() + " and " + micro_batches[j].logp.device().str() +
                                "): a step's micro-batches must share one");
  return d;
}

// A micro-batch as the plan's steps take it: its request (from host copies when it is on a CUDA
// device) and, where its token passes run as tensor operations where it is (step_options::passes),
// those passes.
struct plan_input {
  detail::request_owner q;
  std::unique_ptr<detail::tensor_token_passes> passes;
  const detail::run_request& request() const { return q.request; }
  const reco::part_token_source* tokens() const { return passes ? &passes->source() : nullptr; }
};

plan_input plan_input_of(const policy_inputs& in, const detail::plan_ops& ops, const detail::objective_needs& needs,
                         const at::Device& device, plan_passes passes) {
  const bool on_device = !ops.covariance && detail::tensor_token_passes::applies(in) &&
                         (passes == plan_passes::tensor_ops || (passes == plan_passes::automatic && !device.is_cpu()));
  plan_input p;
  p.q = detail::make_request(device.is_cpu() ? in : on_host(in, ops, on_device), needs);
  if (on_device) p.passes = std::make_unique<detail::tensor_token_passes>(in, p.q.request.use_double);
  return p;
}

// Where a micro-batch's responses start and end, as prompt ids (when given) and counts.
struct part_shape {
  index_t responses = 0, groups = 0;
  bool has_ids = false;
  std::int64_t first_id = 0, last_id = 0;
};

part_shape shape_of_part(const policy_inputs& in, const detail::run_request& q) {
  part_shape p;
  const auto& go = q.use_double ? q.batch_d.group_offsets : q.batch_f.group_offsets;
  p.responses = q.use_double ? q.batch_d.layout.responses : q.batch_f.layout.responses;
  p.groups = go.size() - 1;
  if (in.prompt_ids.defined() && p.responses > 0) {
    const at::Tensor ids = in.prompt_ids.to(at::kCPU, at::kLong).contiguous();
    p.has_ids = true;
    p.first_id = ids.data_ptr<std::int64_t>()[0];
    p.last_id = ids.data_ptr<std::int64_t>()[p.responses - 1];
  }
  return p;
}

// Two neighbouring non-empty parts share a group when their boundary responses share a prompt id.
bool joined(const part_shape& a, const part_shape& b) {
  return a.has_ids && b.has_ids && a.last_id == b.first_id;
}

}  // namespace

namespace detail {

// The plan steps of the objective type the step's calls run: the preset's CPU form, or its CUDA
// form for CUDA tensors (the two differ where the CPU form takes a KL term by key).
plan_ops plan_ops_on(const std::string& preset, const std::map<std::string, double>& overrides, bool given, bool cuda) {
  if (!cuda) return preset_plan_ops(preset, overrides, given);
#if RECO_TORCH_WITH_CUDA
  return preset_plan_ops_cuda(preset, overrides, given);
#else
  fail("logp", "is a CUDA tensor, but reco_torch was built without CUDA");
#endif
}

std::uint64_t config_digest(const std::string& preset, const std::map<std::string, double>& overrides) {
  std::uint64_t h = reco::detail::fnv(1469598103934665603ull, preset.data(), preset.size());
  for (const auto& [k, v] : overrides) {
    h = reco::detail::fnv(h, k.data(), k.size());
    h = reco::detail::fnv(h, &v, sizeof(v));
  }
  return h;
}

// The id of the plan's protocol this build runs (the summaries' layout), compared across ranks
// with the layout: ranks that run different builds fail naming the plan instead of summing
// summaries of different layouts.
std::uint64_t protocol_id(std::uint64_t salt) {
  using namespace reco::detail;
  const std::uint64_t parts[] = {1, plan_header, plan_fields, plan_histogram, plan_status_bits, covariance_slots,
                                 reco::step_plan::confirm_body, refusal_argument_count, salt};
  return fnv(1469598103934665603ull, parts, sizeof parts) & 0x7fffffffffffffffull;
}

namespace {
// What each rank sends in the layout's all-gather: its shape (6), the step id, its configuration
// digest and protocol, then, when it failed before its summaries, its error (argument and
// message, 8 bytes a slot).
constexpr std::size_t shape_slots = 6, error_slots = 40, exchange_slots = shape_slots + 4 + error_slots;

// A reco::error as the other ranks rebuild it: its argument, its message after "reco: argument: ".
struct rank_error {
  bool failed = false;
  std::string argument, message;
  void record(const reco::error& e) {
    if (failed) return;
    failed = true;
    argument = e.argument();
    message = e.message();
  }
  void write(std::int64_t* slots) const {
    char text[error_slots * 8] = {};
    const std::string packed = argument + '\0' + message;
    std::memcpy(text, packed.data(), std::min(packed.size(), sizeof text - 1));
    std::memcpy(slots, text, sizeof text);
  }
  // The refusal every rank raises from the summed summaries (`summed`), with this rank's own error
  // after it: the same argument and words on every rank, the details where they arose.
  [[noreturn]] void rethrow_with(const reco::error& summed) const {
    throw reco::error(summed.argument(), summed.message() + "; on this rank: " + argument + ": " + message);
  }
  static rank_error read(const std::int64_t* slots) {
    char text[error_slots * 8 + 1] = {};
    std::memcpy(text, slots, error_slots * 8);
    rank_error e;
    e.failed = true;
    e.argument = text;
    const std::size_t at = e.argument.size() + 1;
    if (at < error_slots * 8) e.message = text + at;
    return e;
  }
};
}  // namespace

planned_step build_step_plan_impl(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const objective_needs& needs,
                                  const plan_ops& ops, std::uint64_t config,
                                  const std::vector<policy_inputs>& micro_batches, const step_options& options,
                                  const reco::error* early) {
  planned_step out;
  if (group) {
    out.rank = group->getRank();
    out.world_size = group->getSize();
  }
  // What can fail on this rank alone before the collectives (converting its micro-batches, their
  // shapes, their checks) is recorded, not thrown: its error travels with the layout (or as a
  // flag in the summaries when the layout is given), so that every rank raises it after the same
  // collective and none waits for a rank that left.
  rank_error mine_error;
  if (early) mine_error.record(*early);
  at::Device device(at::kCPU);
  std::vector<plan_input> reqs;
  std::vector<part_shape> shapes;
  part_shape mine;
  bool last_has_ids = false;
  reco::step_info provisional;
  provisional.id = options.step;
  provisional.scale = options.average_over_ranks ? static_cast<double>(out.world_size) : 1.0;
  provisional.config = config;
  try {
    if (mine_error.failed) throw *early;
    device = device_of(micro_batches);
    // This rank's micro-batches, converted once (from host copies when they are on a CUDA device),
    // and their token passes on their device where they run there.
    for (const auto& mb : micro_batches) {
      reqs.push_back(plan_input_of(mb, ops, needs, device, options.passes));
      shapes.push_back(shape_of_part(mb, reqs.back().request()));
    }
    // The rank as one part: its responses, its groups (joined micro-batches counted once) and its
    // boundary prompt ids.
    const part_shape* prev = nullptr;
    for (const auto& s : shapes) {
      if (s.responses == 0) continue;
      mine.responses += s.responses;
      mine.groups += s.groups - (prev && joined(*prev, s) ? 1 : 0);
      if (!prev) {
        mine.has_ids = s.has_ids;
        mine.first_id = s.first_id;
      }
      prev = &s;
    }
    last_has_ids = prev && prev->has_ids;
    if (prev) mine.last_id = prev->last_id;

    // This rank's micro-batches as a step of their own (the provisional step): their places from
    // response 0 and group 0 of the rank. Their summaries are made while the ranks' layout is being
    // exchanged, then placed where the rank starts (reco::place_summary).
    provisional.responses = mine.responses;
    index_t response = 0, group_id = 0;
    const part_shape* last = nullptr;
    for (const auto& s : shapes) {
      reco::step_part part;
      part.step = provisional;
      part.first_response = response;
      if (s.responses > 0) {
        if (last && joined(*last, s)) group_id -= 1;
        part.first_group = group_id;
        group_id += s.groups;
        response += s.responses;
        last = &s;
      } else {
        part.first_group = group_id;
      }
      out.parts.push_back(part);
    }
    for (std::size_t j = 0; j < reqs.size(); ++j) ops.check(reqs[j].request(), out.parts[j]);
  } catch (const reco::error& e) {
    mine_error.record(e);
    mine = part_shape{};
    last_has_ids = false;
  }

  // Every rank's shape, step id, configuration and protocol (and error): one all-gather, started
  // before the summaries.
  std::vector<part_shape> ranks(static_cast<std::size_t>(out.world_size));
  std::int64_t local[exchange_slots] = {mine.responses, mine.groups, mine.has_ids ? 1 : 0, mine.first_id,
                                        last_has_ids ? 1 : 0, mine.last_id};
  local[6] = static_cast<std::int64_t>(options.step);
  local[7] = static_cast<std::int64_t>(config);
  local[8] = static_cast<std::int64_t>(protocol_id(options.hooks.build_salt));
  local[9] = mine_error.failed ? 1 : 0;
  if (mine_error.failed) mine_error.write(local + 10);
  std::vector<std::vector<at::Tensor>> gathered(1);
  c10::intrusive_ptr<c10d::Work> layout;
  const bool exchange = group && !options.layout.given();  // else the caller's layout
  if (!group && mine_error.failed) throw reco::error(mine_error.argument, mine_error.message);
  if (exchange) {
    const auto n = static_cast<std::int64_t>(exchange_slots);
    std::vector<at::Tensor> inputs{at::from_blob(local, {n}, at::TensorOptions().dtype(at::kLong)).to(device)};
    for (int r = 0; r < out.world_size; ++r)
      gathered[0].push_back(at::empty({n}, at::TensorOptions().dtype(at::kLong).device(device)));
    layout = group->allgather(gathered, inputs);
    ++out.collectives;
  }
  // Summaries, summed over this rank's micro-batches. With a cut to find, a large micro-batch on
  // the host reads its entropies once: its windowed summary gathers the cut candidates around a
  // sampled quantile of its own (reco::window_sampling). Another, with a process group, gathers
  // them right after its summary, around the digits its own histogram puts the cut in, while its
  // data is still in the caches; the first round gathers them again only if the step's cut falls
  // outside. Bad values are flags in the summaries; anything that still throws here is this
  // rank's failure, which the summaries' all-reduce carries to every rank.
  reco::step_summary total_summary;
  std::vector<reco::part_rounds> states(reqs.size());  // each micro-batch's cut candidates
  bool summaries_failed = mine_error.failed;
  if (!mine_error.failed) {
    try {
      for (std::size_t j = 0; j < reqs.size(); ++j) {
        reco::step_summary s =
            ops.summarize(reqs[j].request(), out.parts[j], reqs[j].tokens(), &states[j], options.window);
        if (group && states[j].window == 0) ops.gather_early(reqs[j].request(), s, states[j], reqs[j].tokens());
        total_summary += std::move(s);
      }
    } catch (const reco::error& e) {
      if (!group) throw;
      mine_error.record(e);
      summaries_failed = true;
    }
  }
  if (exchange) {
    wait_for(layout, "the all-gather of the step's layout (before stage 0 of step " + std::to_string(options.step) + ")");
    // Every rank reads the same table, so every rank raises the same error.
    std::vector<std::vector<std::int64_t>> table;
    for (int r = 0; r < out.world_size; ++r) {
      const at::Tensor host = gathered[0][static_cast<std::size_t>(r)].to(at::kCPU).contiguous();
      table.emplace_back(host.data_ptr<std::int64_t>(), host.data_ptr<std::int64_t>() + exchange_slots);
    }
    for (int r = 0; r < out.world_size; ++r)
      if (table[r][9] != 0) {
        const rank_error e = rank_error::read(table[r].data() + 10);
        throw reco::error(e.argument, "on rank " + std::to_string(r) + " of " + std::to_string(out.world_size) +
                                          ": " + e.message + " (every rank stops before the step's summaries)");
      }
    for (int r = 1; r < out.world_size; ++r) {
      auto differ = [&](const char* what, std::size_t k) {
        fail("plan", std::string("the ranks disagree on ") + what + " (rank 0: " + std::to_string(table[0][k]) +
                         ", rank " + std::to_string(r) + ": " + std::to_string(table[r][k]) + ")");
      };
      if (table[r][8] != table[0][8]) differ("the plan's protocol: they run different builds of the library", 8);
      if (table[r][6] != table[0][6]) differ("the step id", 6);
      if (table[r][7] != table[0][7]) differ("the configuration: preset or overrides differ (their digests)", 7);
    }
    for (int r = 0; r < out.world_size; ++r) {
      const std::int64_t* v = table[static_cast<std::size_t>(r)].data();
      part_shape& p = ranks[static_cast<std::size_t>(r)];
      p.responses = v[0];
      p.groups = v[1];
      p.has_ids = v[2] != 0 && v[4] != 0;  // both ends known (a rank without ids has neither)
      p.first_id = v[3];
      p.last_id = v[5];
      if (v[2] != v[4]) p.has_ids = false;
    }
  } else {
    ranks[0] = mine;
    ranks[0].has_ids = mine.has_ids && last_has_ids;
  }
  // The step's responses, and where this rank starts (responses and group ids): given, or from
  // the ranks' shapes. A wrong given layout fails in finish_plan (responses claimed twice or by no
  // part, or ranks that disagree on the step's size), naming the plan.
  index_t total = 0, first_response = 0, first_group = 0, next_group = 0;
  const part_shape* before = nullptr;
  if (options.layout.given()) {
    const step_layout& l = options.layout;
    if (!summaries_failed &&
        (l.first_response < 0 || l.first_group < 0 || l.first_response + mine.responses > l.step_responses))
      fail("options.layout", "places this rank's " + std::to_string(mine.responses) + " responses at " +
                                 std::to_string(l.first_response) + " (first group " + std::to_string(l.first_group) +
                                 ") of a step of " + std::to_string(l.step_responses));
    total = l.step_responses;
    first_response = l.first_response;
    first_group = l.first_group;
  }
  for (int r = 0; r < out.world_size && !options.layout.given(); ++r) {
    const part_shape& p = ranks[static_cast<std::size_t>(r)];
    if (r == out.rank) {
      first_response = total;
      first_group = p.responses > 0 && before && joined(*before, p) ? next_group - 1 : next_group;
    }
    if (p.responses == 0) continue;
    const index_t start = before && joined(*before, p) ? next_group - 1 : next_group;
    next_group = start + p.groups;
    total += p.responses;
    before = &p;
  }
  reco::step_info step = provisional;
  step.responses = total;
  if (summaries_failed) {
    // This rank's part of the all-reduce: a summary of the step's size holding only its failure.
    // With no ops (an early error) and a given layout, the size is unknown: this rank leaves, and
    // the others fail naming the process group after its timeout.
    if (!ops.refusal) throw reco::error(mine_error.argument, mine_error.message);
    total_summary = ops.refusal(step, mine_error.argument);
  } else {
    // Each micro-batch's place in the step, and the summaries' place.
    for (reco::step_part& part : out.parts) {
      part.step = step;
      part.first_response += first_response;
      part.first_group += first_group;
    }
    if (step.responses != provisional.responses || first_group != 0)
      ops.place(total_summary, provisional, step, first_response, first_group);
  }

  const std::string of_step = " of step " + std::to_string(options.step);
  sum_over_ranks(group, total_summary, "the all-reduce of stage 0 (the step's summaries)" + of_step, out.collectives,
                 device);
  if (options.hooks.after_sum) options.hooks.after_sum(0, total_summary.values);
  if (summaries_failed && !group) throw reco::error(mine_error.argument, mine_error.message);
  try {
    out.plan = ops.finish(step, total_summary);
  } catch (const reco::error& e) {
    if (summaries_failed) mine_error.rethrow_with(e);
    throw;
  }
  // The summed summaries go back to this thread's pool set to zero (their histograms' reached
  // digits only), so that the next plan's summaries need no fill.
  reco::detail::recycle_taken(std::move(total_summary), out.plan.summary_histograms());
  while (!out.plan.complete()) {
    const int stage = out.plan.stage_index();
    reco::step_summary round;
    for (std::size_t j = 0; j < reqs.size(); ++j)
      round += ops.round(out.plan, reqs[j].request(), out.parts[j], &states[j], reqs[j].tokens());
    const bool confirm = out.plan.stage() == reco::step_plan::stage_kind::confirm;
    sum_over_ranks(group, round,
                   "the all-reduce of stage " + std::to_string(stage) +
                       (confirm ? " (the confirmation that every rank holds the same sums)" : " (a selection round)") +
                       of_step,
                   out.collectives, device);
    if (options.hooks.after_sum) options.hooks.after_sum(stage, round.values);
    const std::size_t round_histograms = reco::detail::round_histograms(out.plan);
    out.plan.advance(round);
    reco::detail::recycle_taken(std::move(round), round_histograms);
  }
  return out;
}

}  // namespace detail

planned_step build_step_plan(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& preset,
                             const std::vector<policy_inputs>& micro_batches,
                             const std::map<std::string, double>& overrides, const step_options& options) {
  // Given advantages in any micro-batch: the preset's given-advantage form for the whole step (a
  // micro-batch without them is then named as missing its advantages).
  bool given = false, per_token = false;
  for (const policy_inputs& mb : micro_batches) {
    given = given || mb.gives_advantages();
    per_token = per_token || (mb.token_advantages.defined() && !mb.advantages.defined());
  }
  const std::uint64_t config = detail::config_digest(preset, overrides);
  detail::objective_needs needs;
  detail::plan_ops ops;
  try {
    needs = detail::preset_needs(preset, overrides, given, per_token);
    ops = detail::plan_ops_on(preset, overrides, given, device_of(micro_batches).is_cuda());
  } catch (const reco::error& e) {
    // An unknown preset or a bad override on this rank: the others learn it from the layout.
    return detail::build_step_plan_impl(group, needs, ops, config, micro_batches, options, &e);
  }
  return detail::build_step_plan_impl(group, needs, ops, config, micro_batches, options);
}

namespace detail {

// The plan rebuilt from the summed summaries of the stages so far (summed[0]: the summaries,
// then one per round).
reco::step_plan plan_from_summaries(const plan_ops& ops, const reco::step_info& step,
                                    const std::vector<at::Tensor>& summed) {
  if (summed.empty()) fail("summaries", "needs at least the summed summaries of stage 0");
  // A plan has at most: the summaries, a windowed round discarded and counted again, 4 histogram
  // rounds, the counts and the confirmation.
  if (summed.size() > 16)
    fail("summaries", "holds " + std::to_string(summed.size()) + " stages; a plan has at most 16");
  std::size_t index = 0;
  auto to_summary = [&index](const at::Tensor& t) {
    const std::string name = "summaries[" + std::to_string(index++) + "]";
    if (!t.defined()) fail(name, "is undefined");
    if (!(t.device().is_cpu() || t.device().is_cuda()))
      fail(name, "is on the " + t.device().str() + " device; summaries hold values on the CPU or a CUDA device");
    if (t.scalar_type() != at::kDouble || t.dim() != 1)
      fail(name, "must be a 1-D float64 tensor (as plan_summary returns them), got " +
                     std::string(c10::toString(t.scalar_type())) + " of " + std::to_string(t.dim()) + " dimensions");
    if (t.numel() < static_cast<std::int64_t>(reco::detail::plan_header))
      fail(name, "holds " + std::to_string(t.numel()) + " values, fewer than a summary's header");
    const at::Tensor c = to_host(t);
    reco::step_summary s;
    s.values.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    return s;
  };
  reco::step_plan plan = ops.finish(step, to_summary(summed[0]));
  for (std::size_t r = 1; r < summed.size(); ++r) plan.advance(to_summary(summed[r]));
  return plan;
}

}  // namespace detail

namespace {
// The stateless ops' refusal on this thread (plan_summary at stage 0): its own error, raised after
// the summed refusal when this thread takes that step's summaries.
struct refusal_record {
  bool kept = false;
  std::uint64_t step = 0, config = 0;
  detail::rank_error own;
  void keep(const reco::step_info& st, const reco::error& e) {
    kept = true;
    step = st.id;
    config = st.config;
    own.record(e);
  }
};
refusal_record& refused_here() {
  thread_local refusal_record r;
  return r;
}
reco::step_plan plan_from_summaries_here(const detail::plan_ops& ops, const reco::step_info& step,
                                         const std::vector<at::Tensor>& summed) {
  try {
    return detail::plan_from_summaries(ops, step, summed);
  } catch (const reco::error& e) {
    const refusal_record& r = refused_here();
    if (r.kept && r.step == step.id && r.config == step.config) r.own.rethrow_with(e);
    throw;
  }
}
}  // namespace

at::Tensor plan_summary(const std::string& preset, const std::map<std::string, double>& overrides,
                        const reco::step_part& part_in, const policy_inputs& in, const std::vector<at::Tensor>& summed,
                        plan_passes passes, const reco::error* refused) {
  const bool given = in.gives_advantages();
  const detail::objective_needs needs =
      detail::preset_needs(preset, overrides, given, in.token_advantages.defined() && !in.advantages.defined());
  // On a CUDA device: the plan's token passes run there (or read host copies), and the summary
  // goes back to the device (where NCCL sums it).
  const at::Device device = in.logp.defined() ? in.logp.device() : at::Device(at::kCPU);
  const detail::plan_ops ops = detail::plan_ops_on(preset, overrides, given, device.is_cuda());
  reco::step_part part = part_in;
  part.step.config = detail::config_digest(preset, overrides);
  reco::step_summary s;
  if (summed.empty()) {
    // What this part's rank finds wrong with its inputs is not thrown here, before the caller's
    // all-reduce: the part sends its refusal instead, and every rank raises it from the sums.
    refused_here() = refusal_record{};
    auto refuse = [&](const reco::error& e) {
      refused_here().keep(part.step, e);
      s = ops.refusal(part.step, e.argument());
    };
    try {
      if (refused) throw *refused;
      const plan_input q = plan_input_of(in, ops, needs, device, passes);
      s = ops.summarize(q.request(), part, q.tokens(), nullptr, reco::window_sampling{});
    } catch (const reco::error& e) {
      refuse(e);
    } catch (const c10::Error& e) {
      refuse(reco::error("micro_batches", std::string("could not be converted: ") + e.what_without_backtrace()));
    }
  } else {
    const reco::step_plan plan = plan_from_summaries_here(ops, part.step, summed);
    if (refused) throw *refused;  // the sums carry no refusal: they are not this step's
    if (plan.complete()) return at::empty({0}, at::TensorOptions().dtype(at::kDouble).device(device));
    const plan_input q = plan_input_of(in, ops, needs, device, passes);
    s = ops.round(plan, q.request(), part, nullptr, q.tokens());  // stateless: the round reads the data
  }
  return detail::float64_tensor_on(s.values, device);
}

policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides, const reco::step_part& part_in,
                          const std::vector<at::Tensor>& summed, const reco::error* refused) {
  reco::step_part part = part_in;
  part.step.config = detail::config_digest(preset, overrides);
  planned_step plan;
  const bool given = in.gives_advantages();
  const bool cuda = in.logp.defined() && in.logp.is_cuda();
  plan.plan = plan_from_summaries_here(detail::plan_ops_on(preset, overrides, given, cuda), part.step, summed);
  if (refused) throw *refused;
  plan.parts = {part};
  return policy_loss(preset, in, overrides, plan, 0);
}

}  // namespace torch
RECO_NAMESPACE_END
