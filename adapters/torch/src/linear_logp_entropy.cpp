// reco::torch::linear_logp_entropy: the autograd function over reco/logits/linear_logp_entropy.hpp,
// with LibTorch's matmul as the GEMM and c10d for the vocabulary-parallel all-reduces.
#include "reco/torch/linear_logp_entropy.hpp"

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "reco/logits/call.hpp"
#include "reco/logits/linear_logp_entropy.hpp"

#if RECO_TORCH_WITH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "linear_cuda_call.hpp"
#include "logits_call.hpp"
#endif

RECO_NAMESPACE_BEGIN
namespace torch {
namespace {

using reco::detail::fail;
namespace rl = reco::logits;

std::string shape_of(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// Row-major C[m, n] = alpha op(A) op(B) + beta C on raw pointers, as at::mm_out / addmm_ over
// tensors that view them (LibTorch's BLAS: the GEMM, its blocking and its threads).
struct aten_gemm {
  template <class A>
  void operator()(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, A alpha, const A* a, index_t lda,
                  const A* b, index_t ldb, A beta, A* c, index_t ldc) const {
    const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<A>::value);
    auto view = [&](const A* p, index_t rows, index_t cols, index_t ld, bool transposed) {
      at::Tensor t = transposed ? at::from_blob(const_cast<A*>(p), {cols, rows}, {ld, 1}, opts).t()
                                : at::from_blob(const_cast<A*>(p), {rows, cols}, {ld, 1}, opts);
      return t;
    };
    at::Tensor out = at::from_blob(c, {m, n}, {ldc, 1}, opts);
    const at::Tensor am = view(a, m, k, lda, trans_a), bm = view(b, k, n, ldb, trans_b);
    if (beta == A(0) && alpha == A(1)) at::mm_out(out, am, bm);
    else out.addmm_(am, bm, beta, alpha);
  }
};

rl::dtype dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return rl::dtype::f32;
    case at::kDouble: return rl::dtype::f64;
    case at::kBFloat16: return rl::dtype::bf16;
    case at::kHalf: return rl::dtype::f16;
    default:
      fail(name, std::string("must be float32, float64, bfloat16 or float16, got ") + c10::toString(t.scalar_type()));
  }
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    fail("vocab_group", std::string("an all-reduce failed (did every rank make the same call?): ") + e.what());
  }
}

void all_reduce_sum(const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& t) {
  std::vector<at::Tensor> ts{t};
  wait_for(group->allreduce(ts));
}

// This rank's part of the vocabulary: [begin, begin + V) of total, from one all-reduce of every
// rank's V and N (which must agree).
struct vocab_part {
  index_t begin = 0, total = 0;
};
vocab_part part_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group, index_t V, index_t N) {
  vocab_part p{0, V};
  if (!group) return p;
  const int rank = group->getRank(), world = group->getSize();
  at::Tensor sizes = at::zeros({2 * world}, at::TensorOptions().dtype(at::kLong));
  sizes[rank] = V;
  sizes[world + rank] = N;
  all_reduce_sum(group, sizes);
  const auto* s = sizes.data_ptr<std::int64_t>();
  p.total = 0;
  for (int q = 0; q < world; ++q) {
    if (q < rank) p.begin += s[q];
    p.total += s[q];
    if (s[world + q] != N)
      fail("hidden", "rank " + std::to_string(q) + " has " + std::to_string(s[world + q]) + " rows, this rank " +
                         std::to_string(N) + ": every rank of vocab_group passes the same tokens");
  }
  return p;
}

struct saved_call {
  at::Tensor hidden, weight, bias, tokens, mask;  // bias: empty ({0}) when there is none
  linear_logp_options options;
  bool keep = false;  // keep the last chunk's logits for the backward (CPU, when one will run)
};

// The forward's kept logits (reco::logits::linear_kept_logits), carried to the backward in the
// autograd context as a capsule; the backward takes them.
struct kept_logits_holder : ::torch::CustomClassHolder {
  rl::linear_kept_logits<float> f32;
  rl::linear_kept_logits<double> f64;
  template <class A>
  rl::linear_kept_logits<A>& of() {
    if constexpr (std::is_same_v<A, double>) return f64;
    else return f32;
  }
  bool empty() const { return f32.empty() && f64.empty(); }
};

template <class T>
rl::linear_operands<T> operands_of(const saved_call& c, const vocab_part& part) {
  rl::linear_operands<T> in;
  in.hidden = reinterpret_cast<const T*>(c.hidden.data_ptr());
  in.rows = c.hidden.size(0);
  in.hidden_size = c.hidden.size(1);
  in.hidden_stride_row = c.hidden.stride(0);
  in.hidden_stride_col = c.hidden.stride(1);
  in.weight = reinterpret_cast<const T*>(c.weight.data_ptr());
  in.vocab = c.weight.size(0);
  in.weight_stride_row = c.weight.stride(0);
  in.weight_stride_col = c.weight.stride(1);
  // Size-1 dimensions: any stride is as good as a packed one.
  if (in.rows <= 1) in.hidden_stride_row = in.hidden_size * std::max<index_t>(in.hidden_stride_col, 1);
  if (in.vocab <= 1) in.weight_stride_row = in.hidden_size * std::max<index_t>(in.weight_stride_col, 1);
  if (c.bias.numel() > 0) {
    in.bias = reinterpret_cast<const T*>(c.bias.data_ptr());
    in.bias_stride = c.bias.stride(0);
  }
  in.tokens = c.tokens.data_ptr<std::int64_t>();
  in.row_mask = c.mask.defined() ? c.mask.data_ptr<std::uint8_t>() : nullptr;
  in.vocab_begin = part.begin;
  in.total_vocab = part.total;
  return in;
}

rl::linear_options core_options(const linear_logp_options& o) {
  rl::linear_options c;
  c.temperature = o.temperature;
  if (o.memory_budget > 0) c.memory_budget = o.memory_budget;
  c.chunk_rows = o.chunk_rows;
  return c;
}

#if RECO_TORCH_WITH_CUDA
// A call on CUDA tensors: PyTorch's current stream and cuBLAS handle on the tensors' device, a
// workspace from its caching allocator, and the device error word read back after the kernels
// (one synchronisation; skipped while a CUDA graph is captured, where the NaN rows they leave are
// the only signal).
template <class T, class Call>
void on_cuda(const saved_call& c, const rl::linear_operands<T>& in, Call&& call) {
  const c10::cuda::CUDAGuard guard(c.hidden.device());
  const rl::linear_options o = core_options(c.options);
  const auto plan = rl::linear_cuda_chunking_of(in.rows, in.vocab, in.hidden_size, sizeof(T),
                                                sizeof(rl::accum_t<T>), o.memory_budget, o.chunk_rows);
  const auto dev = at::TensorOptions().device(c.hidden.device());
  const at::Tensor workspace = at::empty({static_cast<std::int64_t>(plan.workspace_bytes)}, dev.dtype(at::kByte));
  const at::Tensor flags = at::zeros({1}, dev.dtype(at::kInt));
  detail::linear_device where;
  where.stream = c10::cuda::getCurrentCUDAStream(c.hidden.device().index()).stream();
  where.cublas = at::cuda::getCurrentCUDABlasHandle();
  where.workspace = workspace.data_ptr();
  where.error_flags = flags.data_ptr<int>();
  call(o, plan, where);
  if (detail::stream_is_capturing(where.stream)) return;
  const int bad = flags.item<int>();
  if (bad & rl::error_token_out_of_range) fail("tokens", "a token id of an unmasked row is outside [0, vocab)");
  if (bad) fail("hidden", "the logits W h + b of an unmasked row are not finite (NaN or infinite values in hidden, "
                          "weight or bias, or a temperature too small for them)");
}
#endif

class linear_function : public ::torch::autograd::Function<linear_function> {
 public:
  static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                  saved_call call) {
    call.hidden = hidden, call.weight = weight, call.bias = bias;
    const at::ScalarType acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const index_t N = hidden.size(0);
    const auto opts = at::TensorOptions().dtype(acc).device(hidden.device());
    at::Tensor logp = at::empty({N}, opts), entropy = at::empty({N}, opts), lse = at::empty({N}, opts);
    const vocab_part part = part_of(call.options.vocab_group, weight.size(0), N);
    const auto kept = call.keep && !hidden.is_cuda() ? c10::make_intrusive<kept_logits_holder>()
                                                     : c10::intrusive_ptr<kept_logits_holder>();
    rl::with_dtype(dtype_of(hidden, "hidden"), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = rl::accum_t<T>;
      const rl::linear_outputs<A> out{logp.data_ptr<A>(), entropy.data_ptr<A>(), lse.data_ptr<A>(), nullptr,
                                      kept ? &kept->of<A>() : nullptr};
      const auto in = operands_of<T>(call, part);
#if RECO_TORCH_WITH_CUDA
      if (hidden.is_cuda()) {
        on_cuda<T>(call, in, [&](const rl::linear_options& o, const rl::linear_cuda_chunking& plan,
                                 const detail::linear_device& where) {
          detail::linear_forward_on_cuda<T>(in, o, out, plan, where);
        });
        return;
      }
#endif
      if (!call.options.vocab_group) {
        rl::linear_forward(aten_gemm{}, in, core_options(call.options), out);
        return;
      }
      // Each chunk's partials: every rank's in its slot of a zero buffer, summed over ranks (one
      // all-reduce), then merged in rank order.
      static_assert(sizeof(rl::row_partial<A>) == 5 * sizeof(A), "row_partial must be five values");
      const auto& group = call.options.vocab_group;
      const int rank = group->getRank(), world = group->getSize();
      auto reduce = [&](rl::row_partial<A>* s, index_t n) {
        at::Tensor buf = at::zeros({world, n, 5}, opts);
        auto* slots = reinterpret_cast<rl::row_partial<A>*>(buf.data_ptr<A>());
        std::memcpy(static_cast<void*>(slots + rank * n), s, static_cast<std::size_t>(n) * sizeof(*s));
        all_reduce_sum(group, buf);
        std::vector<const rl::row_partial<A>*> parts;
        for (int q = 0; q < world; ++q) parts.push_back(slots + q * n);
        rl::merge_partials(parts.data(), world, n, call.options.temperature, s);
      };
      rl::linear_forward(aten_gemm{}, in, core_options(call.options), out, reduce);
    });
    ctx->save_for_backward({hidden, weight, bias});
    ctx->saved_data["tokens"] = call.tokens;
    if (call.mask.defined()) ctx->saved_data["mask"] = call.mask;
    ctx->saved_data["temperature"] = call.options.temperature;
    ctx->saved_data["memory_budget"] = static_cast<std::int64_t>(call.options.memory_budget);
    ctx->saved_data["chunk_rows"] = call.options.chunk_rows;
    // A capsule: the group needs no TorchScript class registration to ride along.
    if (call.options.vocab_group) ctx->saved_data["vocab_group"] = c10::IValue::make_capsule(call.options.vocab_group);
    if (kept && !kept->empty()) ctx->saved_data["kept_logits"] = c10::IValue::make_capsule(kept);
    ctx->saved_data["lse"] = lse;
    ctx->saved_data["entropy"] = entropy.clone();  // the caller may modify the returned one
    ctx->set_materialize_grads(false);
    return {logp, entropy};
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    if (at::GradMode::is_enabled())
      fail("hidden", "reco::torch::linear_logp_entropy does not provide second derivatives (create_graph=True)");
    const auto saved = ctx->get_saved_variables();
    saved_call call;
    call.hidden = saved[0], call.weight = saved[1], call.bias = saved[2];
    call.tokens = ctx->saved_data["tokens"].toTensor();
    if (ctx->saved_data.count("mask")) call.mask = ctx->saved_data["mask"].toTensor();
    call.options.temperature = ctx->saved_data["temperature"].toDouble();
    call.options.memory_budget = static_cast<std::size_t>(ctx->saved_data["memory_budget"].toInt());
    call.options.chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    if (ctx->saved_data.count("vocab_group"))
      call.options.vocab_group =
          c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(ctx->saved_data["vocab_group"].toCapsule());
    const at::Tensor lse = ctx->saved_data["lse"].toTensor(), entropy = ctx->saved_data["entropy"].toTensor();
    // The forward's kept logits, taken by this backward even when it computes nothing, so that a
    // retained graph does not hold them (a second backward, with retain_graph, recomputes them).
    c10::intrusive_ptr<kept_logits_holder> kept;
    if (ctx->saved_data.count("kept_logits")) {
      kept = c10::static_intrusive_pointer_cast<kept_logits_holder>(ctx->saved_data["kept_logits"].toCapsule());
      ctx->saved_data.erase("kept_logits");
    }
    const at::ScalarType acc = lse.scalar_type();
    auto upstream = [&](const at::Tensor& g) { return g.defined() ? g.to(acc).contiguous().view({-1}) : at::Tensor(); };
    const at::Tensor g_logp = upstream(grads[0]), g_entropy = upstream(grads[1]);
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const bool want_b = call.bias.numel() > 0 && ctx->needs_input_grad(2);
    if ((!g_logp.defined() && !g_entropy.defined()) || (!want_h && !want_w && !want_b)) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const index_t N = call.hidden.size(0), H = call.hidden.size(1), V = call.weight.size(0);
    const auto acc_opts = at::TensorOptions().dtype(acc).device(call.hidden.device());
    const auto& group = call.options.vocab_group;
    // Sharded: each rank's dh is its shard's part, summed in the accumulation type.
    at::Tensor dh = want_h ? at::empty({N, H}, group ? acc_opts : call.hidden.options()) : at::Tensor();
    at::Tensor dw = want_w ? at::zeros({V, H}, acc_opts) : at::Tensor();
    at::Tensor db = want_b ? at::zeros({V}, acc_opts) : at::Tensor();
    const vocab_part part = part_of(group, V, N);
    rl::with_dtype(dtype_of(call.hidden, "hidden"), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = rl::accum_t<T>;
      rl::linear_gradients<T> gr;
      gr.kept = kept ? &kept->of<A>() : nullptr;
      gr.grad_logp = g_logp.defined() ? g_logp.data_ptr<A>() : nullptr;
      gr.grad_entropy = g_entropy.defined() ? g_entropy.data_ptr<A>() : nullptr;
      gr.saved_lse = lse.data_ptr<A>();
      gr.saved_entropy = entropy.data_ptr<A>();
      if (want_h) {
        if (group) gr.dhidden_accum = dh.data_ptr<A>();
        else gr.dhidden = reinterpret_cast<T*>(dh.data_ptr());
      }
      gr.dweight = want_w ? dw.data_ptr<A>() : nullptr;
      gr.dbias = want_b ? db.data_ptr<A>() : nullptr;
      const auto in = operands_of<T>(call, part);
#if RECO_TORCH_WITH_CUDA
      if (call.hidden.is_cuda()) {
        on_cuda<T>(call, in, [&](const rl::linear_options& o, const rl::linear_cuda_chunking& plan,
                                 const detail::linear_device& where) {
          detail::linear_backward_on_cuda<T>(in, o, gr, plan, where);
        });
        return;
      }
#endif
      rl::linear_backward(aten_gemm{}, in, core_options(call.options), gr);
    });
    if (want_h && group) {
      all_reduce_sum(group, dh);
      dh = dh.to(call.hidden.scalar_type());
    }
    const at::ScalarType wt = call.weight.scalar_type();
    return {dh, want_w ? dw.to(wt) : at::Tensor(), want_b ? db.to(wt) : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> linear_logp_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                       const at::Tensor& tokens, const at::Tensor& bias,
                                                       const at::Tensor& row_mask, const linear_logp_options& options) {
  if (!hidden.defined()) fail("hidden", "is required");
  if (!weight.defined()) fail("weight", "is required");
  const at::Device device = hidden.device();
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{hidden, "hidden"}, {weight, "weight"}}) {
    if (t.layout() != at::kStrided) fail(name, "must be a dense (strided) tensor");
    if (!t.device().is_cpu() && !(RECO_TORCH_WITH_CUDA && t.device().is_cuda()))
      fail(name, "is on " + t.device().str() + "; reco::torch::linear_logp_entropy runs on CPU tensors" +
                     (RECO_TORCH_WITH_CUDA ? " and CUDA tensors" : " (this build has no CUDA)"));
    if (t.device() != device)
      fail(name, "is on " + t.device().str() + " but hidden on " + device.str() + ": both on one device");
    dtype_of(t, name);
  }
  if (device.is_cuda() && options.vocab_group)
    fail("vocab_group", "is given with CUDA tensors: the device path has no vocabulary shards yet");
  if (hidden.dim() != 2 && hidden.dim() != 3)
    fail("hidden", "must be [N, H] or [R, T, H], got shape " + shape_of(hidden.sizes()));
  if (weight.dim() != 2) fail("weight", "must be [V, H], got shape " + shape_of(weight.sizes()));
  if (weight.scalar_type() != hidden.scalar_type())
    fail("weight", std::string("has dtype ") + c10::toString(weight.scalar_type()) + " but hidden has " +
                       c10::toString(hidden.scalar_type()));
  const index_t H = hidden.size(-1);
  if (weight.size(1) != H)
    fail("weight", "has shape " + shape_of(weight.sizes()) + " but hidden's last dimension is " + std::to_string(H));
  if (weight.size(0) < 1) fail("weight", "needs at least one row (vocabulary entry)");
  if (H < 1) fail("hidden", "needs a hidden size of at least 1");
  if (!std::isfinite(options.temperature) || options.temperature <= 0)
    fail("temperature", "must be finite and > 0, got " + std::to_string(options.temperature));
  const at::IntArrayRef row_shape = hidden.sizes().slice(0, hidden.dim() - 1);
  if (bias.defined()) {
    if (bias.layout() != at::kStrided || bias.device() != device)
      fail("bias", "must be a dense tensor on hidden's device (" + device.str() + ")");
    if (bias.scalar_type() != weight.scalar_type())
      fail("bias", std::string("has dtype ") + c10::toString(bias.scalar_type()) + " but weight has " +
                       c10::toString(weight.scalar_type()));
    if (bias.dim() != 1 || bias.size(0) != weight.size(0))
      fail("bias", "has shape " + shape_of(bias.sizes()) + ", expected [" + std::to_string(weight.size(0)) + "]");
  }
  if (!tokens.defined()) fail("tokens", "is required");
  if (tokens.scalar_type() != at::kLong && tokens.scalar_type() != at::kInt)
    fail("tokens", std::string("must be int64 (or int32), got ") + c10::toString(tokens.scalar_type()));
  if (tokens.device() != device) fail("tokens", "must be on hidden's device (" + device.str() + ")");
  if (tokens.sizes() != row_shape)
    fail("tokens", "has shape " + shape_of(tokens.sizes()) + ", expected hidden's row shape " + shape_of(row_shape));
  saved_call call;
  call.options = options;
  // Only a forward whose backward can run keeps its last chunk (not under no_grad, nor for
  // inputs that need no gradient).
  call.keep = options.keep_last_chunk && at::GradMode::is_enabled() &&
              (hidden.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  call.tokens = tokens.to(at::kLong).contiguous().view({-1});
  if (row_mask.defined()) {
    if (row_mask.scalar_type() != at::kBool && row_mask.scalar_type() != at::kByte)
      fail("row_mask", std::string("must be bool or uint8, got ") + c10::toString(row_mask.scalar_type()));
    if (row_mask.device() != device) fail("row_mask", "must be on hidden's device (" + device.str() + ")");
    if (row_mask.sizes() != row_shape)
      fail("row_mask", "has shape " + shape_of(row_mask.sizes()) + ", expected hidden's row shape " + shape_of(row_shape));
    call.mask = row_mask.to(at::kByte).contiguous().view({-1});
  }
  // [R, T, H]: a view as [R·T, H] where the strides allow one, else a copy (the kernels take one
  // row stride); [N, H] is read with its own strides.
  const at::Tensor h2 = hidden.dim() == 2 ? hidden : hidden.reshape({-1, H});
  // No bias: an empty tensor in its place (autograd's inputs must be defined tensors).
  auto outs = linear_function::apply(h2, weight, bias.defined() ? bias : at::empty({0}, weight.options()), call);
  return {outs[0].view(row_shape), outs[1].view(row_shape)};
}

policy_output linear_policy_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& tokens,
                                 policy_inputs in, bool entropy_input,
                                 const std::function<policy_output(const policy_inputs&)>& loss, const at::Tensor& bias,
                                 const linear_logp_options& options) {
  if (in.logp.defined()) fail("logp", "is computed from hidden; leave policy_inputs::logp undefined");
  if (entropy_input && in.entropy.defined()) fail("entropy", "is computed from hidden; leave policy_inputs::entropy undefined");
  auto [logp, entropy] = linear_logp_entropy(hidden, weight, tokens, bias, in.mask, options);
  in.logp = logp;
  if (entropy_input) in.entropy = entropy;
  return loss(in);
}

}  // namespace torch
RECO_NAMESPACE_END
