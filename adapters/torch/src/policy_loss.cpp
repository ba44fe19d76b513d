// reco::torch::policy_loss: tensor validation and conversion, the autograd node, the presets by
// name.
#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "presets.hpp"
#include "reco/batch_ops/prompt_groups.hpp"

#if RECO_TORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

RECO_NAMESPACE_BEGIN
namespace torch {
namespace {

using reco::detail::fail;

std::string shape_of(const at::Tensor& x) {
  std::ostringstream s;
  s << x.sizes();
  return s.str();
}

std::string dtype_of(const at::Tensor& x) { return c10::toString(x.scalar_type()); }

bool floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// Sparse (or other non-strided) tensors have no element pointer to hand to the objective.
void check_dense(const at::Tensor& x, const char* name) {
  if (x.layout() != at::kStrided) {
    std::ostringstream s;
    s << x.layout();
    fail(name, "must be a dense (strided) tensor, got layout " + s.str());
  }
}

void check_device(const at::Tensor& x, const char* name, const at::Device& device) {
  if (x.device() != device)
    fail(name, "is on " + x.device().str() + " but logp is on " + device.str() + " (all inputs must be on one device)");
}

void check_floating(const at::Tensor& x, const char* name) {
  if (!floating(x.scalar_type()))
    fail(name, "must be float32, float64, bfloat16 or float16, got " + dtype_of(x));
}

// A per-token input: same shape and device as logp, converted to the compute type, contiguous.
at::Tensor token_input(const at::Tensor& x, const char* name, const at::Tensor& logp, at::ScalarType ct) {
  if (!x.defined()) return {};
  check_dense(x, name);
  check_floating(x, name);
  check_device(x, name, logp.device());
  if (x.sizes() != logp.sizes()) fail(name, "has shape " + shape_of(x) + ", expected the shape of logp " + shape_of(logp));
  return x.detach().to(ct).contiguous();
}

// A per-response input: [R], converted to the compute type.
at::Tensor response_input(const at::Tensor& x, const char* name, index_t R, const at::Device& device,
                          at::ScalarType ct) {
  if (!x.defined()) return {};
  check_dense(x, name);
  check_floating(x, name);
  check_device(x, name, device);
  if (x.dim() != 1 || x.size(0) != R)
    fail(name, "has shape " + shape_of(x) + ", expected one entry per response [" + std::to_string(R) + "]");
  return x.detach().to(ct).contiguous();
}

// Offsets: 1-D int64 (int32 is widened), at least one entry.
at::Tensor offsets_input(const at::Tensor& x, const char* name, const at::Device& device) {
  check_dense(x, name);
  if (x.scalar_type() != at::kLong && x.scalar_type() != at::kInt)
    fail(name, "must be int64 (or int32), got " + dtype_of(x));
  check_device(x, name, device);
  if (x.dim() != 1 || x.numel() < 1) fail(name, "must be 1-D with at least one entry ({0}), got shape " + shape_of(x));
  return x.to(at::kLong).contiguous();
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// "[r, t]" for a padded [R, T] input, "[i]" for a packed one.
std::string position(index_t flat, const at::Tensor& like) {
  if (like.dim() == 2 && like.size(1) > 0)
    return "[" + std::to_string(flat / like.size(1)) + ", " + std::to_string(flat % like.size(1)) + "]";
  return "[" + std::to_string(flat) + "]";
}

// The values of an input the objective accepts without using them in the loss (entropy feeds only
// the entropy diagnostics of an objective without an entropy term, selector or entropy clip;
// ref_logp of an objective without a KL term is not read): the core does not check them, so NaN
// or inf in a valid token is found here rather than ignored.
struct unread_values {
  at::Tensor bad;  // [N] bool: non-finite in a valid token
  const char* name = nullptr;
  std::string why;
  std::uint32_t status_bit = 0;  // the core's bit for this input, for stats_tensor's status word
};

unread_values unread_check(const at::Tensor& x, const at::Tensor& mask, const char* name, std::string why,
                           std::uint32_t bit) {
  unread_values u;
  u.bad = at::isfinite(x).logical_not().reshape({-1});
  if (mask.defined()) u.bad.logical_and_(mask.reshape({-1}).to(at::kBool));
  u.name = name;
  u.why = std::move(why);
  u.status_bit = bit;
  return u;
}

// Throws for the first bad value (reads the flags on the host: a synchronisation on CUDA).
void report(const unread_values& u, const at::Tensor& logp) {
  if (!u.bad.any().item<bool>()) return;
  const index_t first = u.bad.nonzero().select(1, 0)[0].item<index_t>();
  fail(u.name, "NaN or infinite value in a valid token at " + position(first, logp) + "; " + u.why);
}

// The loss and d loss / d logp in the compute type: a double loss that the compute type cannot
// hold (float32 for float32/bfloat16/float16 logp), or a gradient that overflowed in it, is an
// error instead of an inf that would end the training run, or LibTorch's conversion message.
void check_representable(const objective_result& r, at::ScalarType ct, const at::Tensor& grad_logp,
                         const at::Tensor& logp) {
  const bool single = ct == at::kFloat;
  const char* type = single ? "float32" : "float64";
  const std::string advice = std::string("; the compute type follows logp (") + c10::toString(logp.scalar_type()) +
                             "): use float64 log-probabilities, or keep the response weights bounded (weight.cap)";
  if (!std::isfinite(r.loss) || (single && std::fabs(r.loss) > FLT_MAX))
    fail("logp", "the loss " + number(r.loss) + " overflows " + type + advice);
  // One reduction on the fast path; the exact search only when the sum is not finite.
  if (grad_logp.numel() == 0 || std::isfinite(grad_logp.sum().item<double>())) return;
  const at::Tensor bad = at::isfinite(grad_logp).logical_not();
  if (!bad.any().item<bool>()) return;  // finite entries whose sum overflowed
  const index_t first = bad.nonzero().select(1, 0)[0].item<index_t>();
  fail("logp", "d loss / d logp overflows " + std::string(type) + " at " + position(first, logp) + advice);
}

template <class T>
span<const T> view_of(const at::Tensor& x) {
  if (!x.defined()) return {};
  return span<const T>(x.data_ptr<T>(), x.numel());
}

// Everything one call needs, prepared before the autograd node runs.
struct prepared_call {
  detail::run_request request;
  const detail::runner* run = nullptr;
  bool cuda = false;
  bool host_stats = true;
  at::ScalarType compute = at::kFloat;
  at::Device device = at::kCPU;
  // For a step plan: the inputs only. No gradient buffers, and no checks of values the plan does
  // not read (the call checks them).
  bool inputs_only = false;
  // Owners of the converted inputs the request points into.
  std::vector<at::Tensor> keep;
  at::Tensor grad_logp;     // [N] compute type
  at::Tensor grad_entropy;  // [N] compute type, when an entropy term is on
  std::vector<unread_values> unread;  // CUDA: checked after the run (CPU: before it)
  at::Tensor logp;                    // the caller's, for positions and dtype in messages
  // Outputs.
  at::Tensor stats;
  objective_result result;
};

// Runs the objective; returns the 0-dim loss.
at::Tensor execute(prepared_call& c) {
  if (!c.cuda) {
    (*c.run)(c.request, c.result);
    check_representable(c.result, c.compute, c.grad_logp, c.logp);
    c.stats = at::empty({stats_size}, at::TensorOptions().dtype(at::kDouble));
    pack_stats(c.result, c.stats.data_ptr<double>());
    return at::scalar_tensor(c.result.loss, at::TensorOptions().dtype(c.compute));
  }
  c.stats = at::empty({stats_size}, at::TensorOptions().dtype(at::kDouble).device(c.device));
  c.request.stats_out = c.stats.data_ptr<double>();
  (*c.run)(c.request, c.result);
  at::Tensor loss = c.stats.select(0, 0).to(c.compute, /*non_blocking=*/false, /*copy=*/true);
  if (c.host_stats) {
    const at::Tensor host = c.stats.to(at::kCPU);
    c.result = unpack_stats(host.data_ptr<double>());
    throw_if_error(c.result.status);
    for (const unread_values& u : c.unread) report(u, c.logp);
    check_representable(c.result, c.compute, c.grad_logp, c.logp);
  } else {
    // No synchronisation: bad values of an unread input set the core's bit for that input in the
    // status word (the last entry), as a bad value of a read input would.
    at::Tensor status = c.stats.select(0, stats_size - 1);
    for (const unread_values& u : c.unread) {
      const double bit = static_cast<double>(u.status_bit);
      const at::Tensor unset = at::fmod(at::floor(status / bit), 2.0).eq(0.0);
      status.add_(at::logical_and(u.bad.any(), unset).to(at::kDouble) * bit);
    }
  }
  return loss;
}

// The autograd node: the forward runs the objective (which writes the per-token gradients), the
// backward scales those gradients by the incoming one.
class policy_loss_function : public ::torch::autograd::Function<policy_loss_function> {
 public:
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& logp,
                            const c10::optional<at::Tensor>& entropy, prepared_call* call) {
    at::Tensor loss = execute(*call);
    ctx->saved_data["grad_logp"] = call->grad_logp.view(logp.sizes());
    ctx->saved_data["logp_dtype"] = static_cast<std::int64_t>(logp.scalar_type());
    if (entropy.has_value() && entropy->defined() && call->grad_entropy.defined()) {
      ctx->saved_data["grad_entropy"] = call->grad_entropy.view(entropy->sizes());
      ctx->saved_data["entropy_dtype"] = static_cast<std::int64_t>(entropy->scalar_type());
    }
    return loss;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grad_outputs) {
    // The saved gradients are constants: a graph built through them would be silently wrong.
    if (at::GradMode::is_enabled())
      fail("logp", "reco::torch::policy_loss does not provide second derivatives (create_graph=True)");
    const at::Tensor& g = grad_outputs[0];
    auto scaled = [&](const char* grad_key, const char* dtype_key) -> at::Tensor {
      const auto it = ctx->saved_data.find(grad_key);
      if (it == ctx->saved_data.end()) return {};
      const auto dtype = static_cast<at::ScalarType>(ctx->saved_data[dtype_key].toInt());
      const at::Tensor saved = it->second.toTensor();
      return (saved * g.to(saved.scalar_type())).to(dtype);
    };
    return {scaled("grad_logp", "logp_dtype"), scaled("grad_entropy", "entropy_dtype"), at::Tensor()};
  }
};

}  // namespace

namespace {

// The layout of logp: packed ([N] with offsets) or padded ([R, T]).
struct input_layout {
  bool packed = false;
  index_t R = 0, max_len = 0;
  at::Tensor offsets;  // packed: int64 [R + 1]
};

input_layout layout_of(const policy_inputs& in, const at::Device& device) {
  const at::Tensor& logp = in.logp;
  input_layout l;
  l.packed = in.offsets.defined();
  if (l.packed) {
    if (logp.dim() != 1)
      fail("logp", "must be 1-D [N] when offsets are given (packed layout), got shape " + shape_of(logp));
    l.offsets = offsets_input(in.offsets, "offsets", device);
    l.R = l.offsets.numel() - 1;
  } else {
    if (logp.dim() != 2)
      fail("logp", "must be [R, T] (padded layout, with mask) or [N] with offsets (packed layout), got shape " +
                       shape_of(logp));
    l.R = logp.size(0);
    l.max_len = logp.size(1);
  }
  return l;
}

// The input rules (reco/input_rules.hpp) on the inputs given, named by this function's argument
// names: the inputs the objective requires are there, those it does not read are refused (their
// values would be silently ignored), and the pairs that say the same thing twice are refused.
void check_input_rules(const policy_inputs& in, const detail::objective_needs& needs, const at::Device& device,
                       const std::string& who) {
  if (in.rewards.defined() && in.advantages.defined())
    fail(needs.rewards ? "advantages" : "rewards",
         who + (needs.rewards ? " computes advantages from rewards" : " takes its advantages from the advantages input") +
             "; give either rewards or advantages (which replace a preset's advantage estimator), not both rewards "
             "and advantages");
  if (in.rewards.defined() && in.token_advantages.defined())
    fail(needs.rewards ? "token_advantages" : "rewards",
         who + (needs.rewards ? " computes advantages from rewards" : " takes its advantages per token") +
             "; give either rewards or token_advantages, not both");
  if (in.advantages.defined() && in.token_advantages.defined())
    fail("token_advantages", "give the advantages per response (advantages) or per token (token_advantages), not "
                             "both");
  const std::pair<call_input, const at::Tensor*> given[] = {
      {call_input::rewards, &in.rewards},         {call_input::advantages, &in.advantages},
      {call_input::token_advantages, &in.token_advantages}, {call_input::ref_logp, &in.ref_logp},
      {call_input::entropy, &in.entropy},         {call_input::response_weights, &in.response_weights}};
  for (const auto& [input, tensor] : given) {
    const bool present = tensor->defined() || (input == call_input::advantages && in.token_advantages.defined());
    if (requires_input(needs, input) && !present) fail(rule_of(input).name, required_message(input, who));
  }
  for (const auto& [input, tensor] : given)
    if (tensor->defined() && refuses_input(needs, input)) fail(rule_of(input).name, unread_message(input, who));
  if (in.token_advantages.defined() && device.is_cuda())
    fail("token_advantages", "advantages per token run on CPU tensors only in this version (the CUDA objectives "
                             "read one advantage per response)");
}

// The prompt groups as int64 offsets [P + 1]: given offsets, built from contiguous prompt ids, or
// equal groups of group_size. They are read by an estimator of rewards and by a response weight
// that uses G (ReCo's 1/(G pbar_old)). With given advantages and any other weight nothing reads
// them: group_size is then an error; group_offsets and prompt_ids stay accepted (and checked), as
// they always were for objectives around reco::given_advantage, and without them the batch is one
// group.
at::Tensor groups_of(const policy_inputs& in, const detail::objective_needs& needs, index_t R,
                     const at::Device& device, const std::string& who) {
  at::Tensor groups;
  if (in.group_offsets.defined() && in.prompt_ids.defined())
    fail("prompt_ids", "give either group_offsets or prompt_ids, not both");
  if (in.group_size < 0) fail("group_size", "must be >= 0 (0 = not given), got " + std::to_string(in.group_size));
  if (in.group_size > 0 && (in.group_offsets.defined() || in.prompt_ids.defined()))
    fail("group_size", std::string("give one of group_offsets, prompt_ids and group_size, not group_size and ") +
                           (in.group_offsets.defined() ? "group_offsets" : "prompt_ids"));
  const bool reads_groups = needs.rewards || needs.group_size;
  if (!reads_groups && in.group_size > 0)
    fail("group_size", who + " reads no groups: its advantages are given and its response weight does not use the "
                             "group size; it does not read this input");
  if (!reads_groups && !in.group_offsets.defined() && !in.prompt_ids.defined()) {
    const std::vector<index_t> whole{0, R};  // one group of every response; no component reads it
    groups = at::tensor(whole, at::TensorOptions().dtype(at::kLong)).to(device);
  } else if (in.group_size > 0) {
    const index_t G = in.group_size;
    if (R % G != 0)
      fail("group_size", "is " + std::to_string(G) + " but the " + std::to_string(R) +
                             " responses are not a whole number of groups of that size (give group_offsets or "
                             "prompt_ids for groups of different sizes)");
    std::vector<index_t> go;
    for (index_t g = 0; g <= R; g += G) go.push_back(g);
    if (R == 0) go = {0};
    groups = at::tensor(go, at::TensorOptions().dtype(at::kLong)).to(device);
  } else if (in.group_offsets.defined()) {
    groups = offsets_input(in.group_offsets, "group_offsets", device);
  } else if (in.prompt_ids.defined()) {
    const at::Tensor& ids = in.prompt_ids;
    check_dense(ids, "prompt_ids");
    if (!at::isIntegralType(ids.scalar_type(), /*includeBool=*/false))
      fail("prompt_ids", "must be an integer tensor, got " + dtype_of(ids));
    check_device(ids, "prompt_ids", device);
    if (ids.dim() != 1 || ids.size(0) != R)
      fail("prompt_ids", "has shape " + shape_of(ids) + ", expected one id per response [" + std::to_string(R) + "]");
    // R ids: small; on CUDA this is the call's one extra host round trip.
    const at::Tensor host_ids = ids.to(at::kCPU, at::kLong).contiguous();
    const std::vector<index_t> go =
        group_offsets_from_prompt_ids(span<const index_t>(host_ids.data_ptr<index_t>(), host_ids.numel()));
    groups = at::tensor(go, at::TensorOptions().dtype(at::kLong)).to(device);
  } else if (!needs.rewards) {
    fail("group_size", "is required (or give group_offsets or prompt_ids): with given advantages, the response "
                       "weight 1/(G pbar_old) of " + who + " still needs the group size G");
  } else {
    fail("group_offsets", "is required (or give prompt_ids or group_size): advantages and response weights are per "
                          "prompt group");
  }

  return groups;
}

// Validates and converts the inputs into c.request (no objective runs yet). `who` names the
// objective in errors ("preset 'dapo'").
void build_request(const policy_inputs& in, const detail::objective_needs& needs, prepared_call& c,
                   const std::string& who) {
  if (!in.logp.defined()) fail("logp", "is required");
  check_dense(in.logp, "logp");
  check_floating(in.logp, "logp");
  const at::Tensor& logp = in.logp;
  const at::Device device = logp.device();
  if (!device.is_cpu() && !device.is_cuda())
    fail("logp", "is on " + device.str() + "; reco::torch runs on CPU and CUDA tensors");

  c.device = device;
  c.cuda = device.is_cuda();
  c.host_stats = in.host_stats;
  c.compute = logp.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType ct = c.compute;

  const input_layout layout = layout_of(in, device);
  const bool packed = layout.packed;
  const index_t R = layout.R, max_len = layout.max_len;
  const at::Tensor& offsets = layout.offsets;
  check_input_rules(in, needs, device, who);

  // Per-token and per-response values in the compute type.
  const at::Tensor lp = logp.detach().to(ct).contiguous();
  const at::Tensor old_lp = token_input(in.old_logp, "old_logp", logp, ct);
  const at::Tensor ref_lp = token_input(in.ref_logp, "ref_logp", logp, ct);
  const at::Tensor ent = token_input(in.entropy, "entropy", logp, ct);
  const at::Tensor tw = token_input(in.token_weights, "token_weights", logp, ct);
  const at::Tensor roll_lp = token_input(in.rollout_logp, "rollout_logp", logp, ct);
  const at::Tensor tok_adv = token_input(in.token_advantages, "token_advantages", logp, ct);
  const at::Tensor rewards = response_input(in.rewards, "rewards", R, device, ct);
  if (in.advantages.defined() && logp.dim() == 2 && in.advantages.sizes() == logp.sizes())
    fail("advantages", "has shape " + shape_of(in.advantages) + " (the shape of logp): one advantage per token "
                           "goes in token_advantages; advantages takes one per response [" + std::to_string(R) + "]");
  const at::Tensor adv = response_input(in.advantages, "advantages", R, device, ct);
  const at::Tensor rw = response_input(in.response_weights, "response_weights", R, device, ct);

  at::Tensor mask;
  if (in.mask.defined()) {
    check_dense(in.mask, "mask");
    if (in.mask.scalar_type() != at::kBool && in.mask.scalar_type() != at::kByte)
      fail("mask", "must be bool or uint8, got " + dtype_of(in.mask));
    check_device(in.mask, "mask", device);
    if (in.mask.sizes() != logp.sizes())
      fail("mask", "has shape " + shape_of(in.mask) + ", expected the shape of logp " + shape_of(logp));
    mask = in.mask.contiguous();
  }

  const at::Tensor groups = groups_of(in, needs, R, device, who);

  // Accepted inputs that the objective does not check (see unread_values).
  c.logp = logp;
  if (ent.defined() && !needs.entropy && !c.inputs_only)
    c.unread.push_back(unread_check(ent, mask, "entropy",
                                    who + " uses entropy only for the entropy_mean / entropy_kept_mean diagnostics",
                                    reco::bad_entropy));
  if (ref_lp.defined() && !needs.ref_logp && !c.inputs_only)
    c.unread.push_back(unread_check(ref_lp, mask, "ref_logp", who + " has no KL term and does not use ref_logp",
                                    reco::bad_ref_logp));
  if (!c.cuda) {
    for (const unread_values& u : c.unread) report(u, logp);
    c.unread.clear();
  }

  // Gradients: every token is written by the objective (0 for invalid ones).
  const index_t N = logp.numel();
  const auto opts = at::TensorOptions().dtype(ct).device(device);
  if (!c.inputs_only) {
    c.grad_logp = at::empty({N}, opts);
    if (needs.entropy_gradient) c.grad_entropy = at::empty({N}, opts);
  }

  c.keep = {lp, old_lp, ref_lp, ent, tw, rewards, adv, rw, mask, offsets, groups, roll_lp, tok_adv};
  auto fill = [&](auto tag, auto& batch, auto& grads) {
    using T = decltype(tag);
    batch.layout = packed ? reco::packed(span<const index_t>(offsets.data_ptr<index_t>(), offsets.numel()))
                          : reco::padded(R, max_len);
    batch.group_offsets = span<const index_t>(groups.data_ptr<index_t>(), groups.numel());
    batch.logp = view_of<T>(lp);
    batch.old_logp = view_of<T>(old_lp);
    batch.ref_logp = view_of<T>(ref_lp);
    batch.entropy = view_of<T>(ent);
    batch.token_weights = view_of<T>(tw);
    batch.rollout_logp = view_of<T>(roll_lp);
    batch.rewards = view_of<T>(rewards);
    batch.advantages = view_of<T>(adv);
    batch.token_advantages = view_of<T>(tok_adv);
    batch.response_weights = view_of<T>(rw);
    if (mask.defined()) batch.mask = span<const std::uint8_t>(static_cast<const std::uint8_t*>(mask.data_ptr()), N);
    if (c.grad_logp.defined()) grads.logp = span<T>(c.grad_logp.data_ptr<T>(), N);
    if (c.grad_entropy.defined()) grads.entropy = span<T>(c.grad_entropy.data_ptr<T>(), N);
  };
  c.request.use_double = ct == at::kDouble;
  if (c.request.use_double)
    fill(double{}, c.request.batch_d, c.request.grads_d);
  else
    fill(float{}, c.request.batch_f, c.request.grads_f);
  c.request.norm = in.normalisers;
  if (in.plan != nullptr) {
    if (in.micro_batch >= in.plan->parts.size())
      fail("micro_batch", "is " + std::to_string(in.micro_batch) + " but the plan has " +
                              std::to_string(in.plan->parts.size()) + " micro-batches on this rank");
    c.request.plan = &in.plan->plan;
    c.request.part = in.plan->parts[in.micro_batch];
  }
}

}  // namespace

namespace detail {

request_owner make_request(const policy_inputs& in, const objective_needs& needs) {
  prepared_call c;
  c.inputs_only = true;
  build_request(in, needs, c, "this objective");
  request_owner r;
  r.request = c.request;
  r.keep = c.keep;
  r.keep.push_back(c.grad_logp);
  r.keep.push_back(c.grad_entropy);
  r.cuda = c.cuda;
  return r;
}

policy_output policy_loss_impl(const policy_inputs& in, const objective_needs& needs, const runner& cpu,
                               const runner& cuda, const std::string& who) {
  prepared_call c;
  build_request(in, needs, c, who);
  [[maybe_unused]] const at::Device device = c.device;

  if (c.cuda) {
#if RECO_TORCH_WITH_CUDA
    if (!cuda)
      fail("logp", "is a CUDA tensor, but this objective type was compiled for the CPU only: call "
                   "reco::torch::policy_loss(obj, ...) from a .cu translation unit, or use a preset by name");
    c.run = &cuda;
#else
    (void)cuda;
    fail("logp", "is a CUDA tensor, but reco_torch was built without CUDA");
#endif
  } else {
    c.run = &cpu;
  }

#if RECO_TORCH_WITH_CUDA
  c10::optional<c10::cuda::CUDAGuard> guard;
  if (c.cuda) {
    guard.emplace(device);
    c.request.device = device.index();
    c.request.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  }
#endif

  c10::optional<at::Tensor> entropy_arg;
  if (needs.entropy_gradient && in.entropy.defined()) entropy_arg = in.entropy;
  policy_output out;
  out.loss = policy_loss_function::apply(in.logp, entropy_arg, &c);
  out.stats = c.result;
  out.stats_tensor = c.stats;
  return out;
}

}  // namespace detail

const std::vector<std::string>& preset_names() { return registry::preset_names(); }
std::vector<std::string> composition_slots() { return detail::composition_slot_list(); }
std::vector<std::string> choice_labels(const std::string& preset) { return detail::preset_choice_labels(preset); }
std::vector<std::string> as_composition(const std::string& preset) { return detail::preset_as_composition(preset); }

std::vector<std::pair<std::string, std::string>> peer_presets() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const registry::peer_preset& p : registry::peer_preset_table) out.emplace_back(p.name, p.base);
  return out;
}

std::vector<std::string> override_keys(const std::string& preset) { return detail::preset_keys(preset); }

policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides, const planned_step& plan,
                          std::size_t micro_batch) {
  policy_inputs with_plan = in;
  with_plan.plan = &plan;
  with_plan.micro_batch = micro_batch;
  return policy_loss(preset, with_plan, overrides);
}

policy_output policy_loss(const std::string& preset, const policy_inputs& in,
                          const std::map<std::string, double>& overrides) {
  // Advantages given: the preset's estimator is replaced by them (rewards too is an error, below).
  const bool given = in.gives_advantages();
  const detail::objective_needs needs =
      detail::preset_needs(preset, overrides, given, in.token_advantages.defined() && !in.advantages.defined());
  const detail::runner cpu = [&](const detail::run_request& q, objective_result& out) {
    detail::run_preset_cpu(preset, overrides, given, q, out);
  };
  detail::runner cuda;
#if RECO_TORCH_WITH_CUDA
  cuda = [&](const detail::run_request& q, objective_result&) {
    detail::run_preset_cuda(preset, overrides, given, q);
  };
#endif
  // Name the key that switched a KL term on, where one did (a preset without a KL term).
  std::string who = (preset.find('=') != std::string::npos ? "composition '" : "preset '") + preset + "'";
  for (const auto& kv : overrides)
    if (kv.first.compare(0, 3, "kl.") == 0) {
      who += " (KL term set by overrides." + kv.first + ")";
      break;
    }
  return detail::policy_loss_impl(in, needs, cpu, cuda, who);
}

}  // namespace torch
RECO_NAMESPACE_END
