// reco::torch::build_step_plan: the step plan of a rank's micro-batches over a c10d process group.
#include "reco/torch/step_plan.hpp"

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
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    fail("process_group", std::string(what) + " failed (did every rank call build_step_plan for this step within "
                                              "the process group's timeout?): " + e.what());
  }
}

// Element-wise sum over ranks, in place. The collective runs on `device`: the step's tensors' (a
// CUDA device for NCCL, which takes CUDA tensors only; Gloo takes either).
void sum_over_ranks(const c10::intrusive_ptr<c10d::ProcessGroup>& group, reco::step_summary& s, const char* what,
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

planned_step build_step_plan_impl(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const objective_needs& needs,
                                  const plan_ops& ops, std::uint64_t config,
                                  const std::vector<policy_inputs>& micro_batches, const step_options& options) {
  planned_step out;
  if (group) {
    out.rank = group->getRank();
    out.world_size = group->getSize();
  }
  const at::Device device = device_of(micro_batches);
  // This rank's micro-batches, converted once (from host copies when they are on a CUDA device),
  // and their token passes on their device where they run there.
  std::vector<plan_input> reqs;
  std::vector<part_shape> shapes;
  for (const auto& mb : micro_batches) {
    reqs.push_back(plan_input_of(mb, ops, needs, device, options.passes));
    shapes.push_back(shape_of_part(mb, reqs.back().request()));
  }
  // The rank as one part: its responses, its groups (joined micro-batches counted once) and its
  // boundary prompt ids.
  part_shape mine;
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
  bool last_has_ids = prev && prev->has_ids;
  if (prev) mine.last_id = prev->last_id;

  // This rank's micro-batches as a step of their own (the provisional step): their places from
  // response 0 and group 0 of the rank. Their summaries are made while the ranks' layout is being
  // exchanged, then placed where the rank starts (reco::place_summary).
  reco::step_info provisional;
  provisional.id = options.step;
  provisional.responses = mine.responses;
  provisional.scale = options.average_over_ranks ? static_cast<double>(out.world_size) : 1.0;
  provisional.config = config;
  {
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
  }

  // Every rank's shape: one all-gather of 6 integers, started before the summaries.
  std::vector<part_shape> ranks(static_cast<std::size_t>(out.world_size));
  std::int64_t local[6] = {mine.responses, mine.groups, mine.has_ids ? 1 : 0, mine.first_id,
                           last_has_ids ? 1 : 0, mine.last_id};
  std::vector<std::vector<at::Tensor>> gathered(1);
  c10::intrusive_ptr<c10d::Work> layout;
  const bool exchange = group && !options.layout.given();  // else the caller's layout
  if (exchange) {
    std::vector<at::Tensor> inputs{at::from_blob(local, {6}, at::TensorOptions().dtype(at::kLong)).to(device)};
    for (int r = 0; r < out.world_size; ++r)
      gathered[0].push_back(at::empty({6}, at::TensorOptions().dtype(at::kLong).device(device)));
    layout = group->allgather(gathered, inputs);
    ++out.collectives;
  }
  // Summaries, summed over this rank's micro-batches (a bad batch throws here, after the
  // all-gather it joined has completed, so that the rank leaves no collective half done). With a
  // cut to find, a large micro-batch on the host reads its entropies once: its windowed summary
  // gathers the cut candidates around a sampled quantile of its own (reco::window_sampling).
  // Another, with a process group, gathers them right after its summary, around the digits its own
  // histogram puts the cut in, while its data is still in the caches; the first round gathers them
  // again only if the step's cut falls outside.
  reco::step_summary total_summary;
  std::vector<reco::part_rounds> states(reqs.size());  // each micro-batch's cut candidates
  try {
    for (std::size_t j = 0; j < reqs.size(); ++j) {
      reco::step_summary s =
          ops.summarize(reqs[j].request(), out.parts[j], reqs[j].tokens(), &states[j], options.window);
      if (group && states[j].window == 0) ops.gather_early(reqs[j].request(), s, states[j], reqs[j].tokens());
      total_summary += std::move(s);
    }
  } catch (...) {
    if (layout) {
      try {
        layout->wait();
      } catch (...) {
      }
    }
    throw;
  }
  if (exchange) {
    wait_for(layout, "all-gather of the step's layout");
    for (int r = 0; r < out.world_size; ++r) {
      const at::Tensor host = gathered[0][static_cast<std::size_t>(r)].to(at::kCPU);
      const std::int64_t* v = host.data_ptr<std::int64_t>();
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
    if (l.first_response < 0 || l.first_group < 0 || l.first_response + mine.responses > l.step_responses)
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
  // Each micro-batch's place in the step, and the summaries' place.
  for (reco::step_part& part : out.parts) {
    part.step = step;
    part.first_response += first_response;
    part.first_group += first_group;
  }
  if (step.responses != provisional.responses || first_group != 0)
    ops.place(total_summary, provisional, step, first_response, first_group);

  sum_over_ranks(group, total_summary, "all-reduce of the step summaries", out.collectives, device);
  out.plan = ops.finish(step, total_summary);
  // The summed summaries go back to this thread's pool set to zero (their histograms' reached
  // digits only), so that the next plan's summaries need no fill.
  reco::detail::recycle_taken(std::move(total_summary), out.plan.summary_histograms());
  while (!out.plan.complete()) {
    reco::step_summary round;
    for (std::size_t j = 0; j < reqs.size(); ++j)
      round += ops.round(out.plan, reqs[j].request(), out.parts[j], &states[j], reqs[j].tokens());
    sum_over_ranks(group, round, "all-reduce of a selection round", out.collectives, device);
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
  bool given = false;
  for (const policy_inputs& mb : micro_batches) given = given || mb.gives_advantages();
  const detail::objective_needs needs = detail::preset_needs(preset, overrides, given);
  const bool cuda = device_of(micro_batches).is_cuda();
  return detail::build_step_plan_impl(group, needs, detail::plan_ops_on(preset, overrides, given, cuda),
                                      detail::config_digest(preset, overrides), micro_batches, options);
}

namespace detail {

// The plan rebuilt from the summed summaries of the stages so far (summed[0]: the summaries,
// then one per round).
reco::step_plan plan_from_summaries(const plan_ops& ops, const reco::step_info& step,
                                    const std::vector<at::Tensor>& summed) {
  if (summed.empty()) fail("summaries", "needs at least the summed summaries of stage 0");
  auto to_summary = [](const at::Tensor& t) {
    if (t.scalar_type() != at::kDouble || t.dim() != 1)
      fail("summaries", "must be 1-D float64 tensors (as plan_summary returns them)");
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

at::Tensor plan_summary(const std::string& preset, const std::map<std::string, double>& overrides,
                        const reco::step_part& part_in, const policy_inputs& in, const std::vector<at::Tensor>& summed,
                        plan_passes passes) {
  const bool given = in.gives_advantages();
  const detail::objective_needs needs = detail::preset_needs(preset, overrides, given);
  // On a CUDA device: the plan's token passes run there (or read host copies), and the summary
  // goes back to the device (where NCCL sums it).
  const at::Device device = in.logp.defined() ? in.logp.device() : at::Device(at::kCPU);
  const detail::plan_ops ops = detail::plan_ops_on(preset, overrides, given, device.is_cuda());
  reco::step_part part = part_in;
  part.step.config = detail::config_digest(preset, overrides);
  const plan_input q = plan_input_of(in, ops, needs, device, passes);
  reco::step_summary s;
  if (summed.empty()) {
    s = ops.summarize(q.request(), part, q.tokens(), nullptr, reco::window_sampling{});
  } else {
    const reco::step_plan plan = detail::plan_from_summaries(ops, part.step, summed);
    if (plan.complete()) return at::empty({0}, at::TensorOptions().dtype(at::kDouble).device(device));
    s = ops.round(plan, q.request(), part, nullptr, q.tokens());  // stateless: the round reads the data
  }
  return detail::float64_tensor_on(s.values, device);
}

policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides, const reco::step_part& part_in,
                          const std::vector<at::Tensor>& summed) {
  reco::step_part part = part_in;
  part.step.config = detail::config_digest(preset, overrides);
  planned_step plan;
  const bool given = in.gives_advantages();
  const bool cuda = in.logp.defined() && in.logp.is_cuda();
  plan.plan = detail::plan_from_summaries(detail::plan_ops_on(preset, overrides, given, cuda), part.step, summed);
  plan.parts = {part};
  return policy_loss(preset, in, overrides, plan, 0);
}

}  // namespace torch
RECO_NAMESPACE_END
