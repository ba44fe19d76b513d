// reco::torch::token_logp_entropy: the autograd function over the reco::logits kernels.
#include "reco/torch/token_logp_entropy.hpp"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "logits_call.hpp"
#include "reco/logits/call.hpp"
#include "reco/logits/logp_entropy.hpp"

#if RECO_TORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

RECO_NAMESPACE_BEGIN
namespace torch {
namespace {

using reco::detail::fail;

std::string shape_of(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// Sparse (or other non-strided) tensors have no element pointer to hand to the kernels.
void check_dense(const at::Tensor& x, const char* name) {
  if (x.layout() != at::kStrided) {
    std::ostringstream o;
    o << x.layout();
    fail(name, "must be a dense (strided) tensor, got layout " + o.str());
  }
}

reco::logits::dtype logit_type_of(const at::Tensor& logits) {
  switch (logits.scalar_type()) {
    case at::kFloat: return reco::logits::dtype::f32;
    case at::kDouble: return reco::logits::dtype::f64;
    case at::kBFloat16: return reco::logits::dtype::bf16;
    case at::kHalf: return reco::logits::dtype::f16;
    default:
      fail("logits", std::string("must be float32, float64, bfloat16 or float16, got ") +
                         c10::toString(logits.scalar_type()));
  }
}

// The logits as blocks of rows with one row stride each: a [N, V] tensor with strided rows is one
// block; a [R, T, V] tensor is one block when its rows are equally spaced, else one block per
// leading index (logits[:, :-1, :] of a [R, T + 1, V] tensor, read without a copy).
struct row_blocks {
  index_t vocab = 0, row_stride = 0;
  index_t count = 1, rows_per_block = 0;  // count blocks of rows_per_block rows
  index_t block_stride = 0;               // elements between block starts in the logits

  index_t rows() const { return count * rows_per_block; }
};

// Where the backward writes d loss / d logits: rows with the logits' row stride (the kernels use
// one stride for both), blocks block_stride apart, in a buffer of `elements`.
struct gradient_layout {
  index_t block_stride = 0, elements = 0;
  std::vector<int64_t> strides;  // of the [N, V] or [R, T, V] view into the buffer
};

// The smallest buffer with the logits' row stride: blocks interleaved (block k's rows start k·V
// after the first block's, as in the dense [T, R, V].transpose(0, 1) layout) when one row stride
// leaves room for every block's row, else packed one after another. For logits without gaps
// (contiguous, [T, R, V].transpose(0, 1), logits[:, :-1, :]) this is exactly numel elements; with
// gaps inside the rows' stride (a slice of the vocabulary, every other row) at most rows × stride.
gradient_layout gradient_layout_of(const at::Tensor& logits, const row_blocks& b) {
  gradient_layout g;
  const index_t V = b.vocab, rs = b.row_stride, rows = b.rows_per_block;
  if (b.count > 1 && rs >= b.count * V) {
    g.block_stride = V;
    g.elements = (rows - 1) * rs + b.count * V;
  } else {
    g.block_stride = rows * rs;
    g.elements = b.count * rows * rs;
  }
  if (logits.dim() == 2) {
    g.strides = {rs, 1};
  } else {
    const index_t T = logits.size(1);
    g.strides = {b.count > 1 ? g.block_stride : T * rs, rs, 1};
  }
  return g;
}

row_blocks blocks_of(const at::Tensor& logits) {
  if (logits.dim() != 2 && logits.dim() != 3)
    fail("logits", "must be [N, V] or [R, T, V], got shape " + shape_of(logits.sizes()));
  row_blocks b;
  b.vocab = logits.size(-1);
  if (b.vocab < 1) fail("logits", "needs a vocabulary of at least one entry, got shape " + shape_of(logits.sizes()));
  if (b.vocab > 1 && logits.stride(-1) != 1)
    fail("logits", "the vocabulary dimension must be contiguous (stride 1), got strides " +
                       shape_of(logits.strides()) + "; a copy of the whole logits is left to the caller");
  if (logits.dim() == 2) {
    b.rows_per_block = logits.size(0);
    b.row_stride = b.rows_per_block > 1 ? logits.stride(0) : b.vocab;
  } else {
    const index_t R = logits.size(0), T = logits.size(1);
    b.row_stride = T > 1 ? logits.stride(1) : (R > 1 ? logits.stride(0) : b.vocab);
    if (T <= 1 || R <= 1 || logits.stride(0) == T * logits.stride(1)) {
      b.rows_per_block = R * T;
    } else {
      b.count = R;
      b.rows_per_block = T;
      b.block_stride = logits.stride(0);
    }
  }
  if (b.rows() > 1 && b.row_stride < b.vocab)
    fail("logits", "rows overlap (strides " + shape_of(logits.strides()) + "): give each row its own memory");
  return b;
}

template <class P>
P* shift(P* p, index_t elements, std::size_t size) {
  if (p == nullptr) return nullptr;
  using byte_t = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<byte_t*>(p) + elements * static_cast<index_t>(size));
}

// The call for block k: every pointer advanced to the block's first row.
reco::logits::call block_call(const reco::logits::call& all, const row_blocks& b, index_t dlogits_block_stride,
                               index_t k) {
  reco::logits::call c = all;
  const std::size_t logit_size = reco::logits::value_bytes(all.type);
  const std::size_t acc_size = reco::logits::accum_bytes(all.type);
  const index_t first = k * b.rows_per_block;
  c.rows = b.rows_per_block;
  c.logits = shift(all.logits, k * b.block_stride, logit_size);
  c.dlogits = shift(all.dlogits, k * dlogits_block_stride, logit_size);
  c.tokens = all.tokens ? all.tokens + first : nullptr;
  c.row_mask = all.row_mask ? all.row_mask + first : nullptr;
  c.logp = shift(all.logp, first, acc_size);
  c.entropy = shift(all.entropy, first, acc_size);
  c.lse = shift(all.lse, first, acc_size);
  c.grad_logp = shift(all.grad_logp, first, acc_size);
  c.grad_entropy = shift(all.grad_entropy, first, acc_size);
  c.saved_lse = shift(all.saved_lse, first, acc_size);
  c.saved_entropy = shift(all.saved_entropy, first, acc_size);
  return c;
}

// Runs `cpu` or `cuda` on every block (CUDA: on PyTorch's current stream of the logits' device).
template <class Cpu, class Cuda>
void for_each_block(const at::Tensor& logits, reco::logits::call all, const row_blocks& b,
                    index_t dlogits_block_stride, Cpu&& cpu, Cuda&& cuda) {
  if (logits.is_cuda()) {
#if RECO_TORCH_WITH_CUDA
    const c10::cuda::CUDAGuard guard(logits.device());
    all.stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    for (index_t k = 0; k < b.count; ++k) cuda(block_call(all, b, dlogits_block_stride, k));
#else
    (void)cuda;
    fail("logits", "is a CUDA tensor, but reco_torch was built without CUDA");
#endif
  } else {
    for (index_t k = 0; k < b.count; ++k) cpu(block_call(all, b, dlogits_block_stride, k));
  }
}

// The inputs of a forward or backward call (the outputs are set by the caller).
reco::logits::call input_call(const at::Tensor& logits, const row_blocks& b, const at::Tensor& tokens,
                               double temperature, const void* row_mask) {
  reco::logits::call c;
  c.type = logit_type_of(logits);
  c.logits = logits.data_ptr();
  c.vocab = b.vocab;
  c.row_stride = b.row_stride;
  c.tokens = tokens.data_ptr<std::int64_t>();
  c.temperature = temperature;
  c.row_mask = static_cast<const std::uint8_t*>(row_mask);
  return c;
}

class logp_entropy_function : public ::torch::autograd::Function<logp_entropy_function> {
 public:
  static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                  const at::Tensor& tokens, double temperature,
                                                  const c10::optional<at::Tensor>& row_mask) {
    const row_blocks b = blocks_of(logits);
    const at::ScalarType acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const auto opts = at::TensorOptions().dtype(acc).device(logits.device());
    const index_t N = b.rows();
    at::Tensor logp = at::empty({N}, opts), entropy = at::empty({N}, opts), lse = at::empty({N}, opts);
    if (N > 0) {
      reco::logits::call c = input_call(logits, b, tokens, temperature,
                                         row_mask ? row_mask->data_ptr() : nullptr);
      c.logp = logp.data_ptr();
      c.entropy = entropy.data_ptr();
      c.lse = lse.data_ptr();
#if RECO_TORCH_WITH_CUDA
      at::Tensor flags;
      void* stream = nullptr;
      if (logits.is_cuda()) flags = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(logits.device()));
      for_each_block(logits, c, b, 0, reco::logits::forward_cpu, [&](const reco::logits::call& k) {
        stream = k.stream;
        detail::logits_forward_cuda(k, flags.data_ptr<int>());
      });
      // The kernels cannot throw: they mark a bad token or an all -inf row in an error word (and
      // make that row NaN). Read it back (one synchronisation) and raise what the CPU path raises,
      // except while a CUDA graph is being captured, where the NaN rows are the only signal.
      if (flags.defined() && !detail::stream_is_capturing(stream))
        reco::logits::throw_if_error_flags(flags.item<int>());
#else
      for_each_block(logits, c, b, 0, reco::logits::forward_cpu, [](const reco::logits::call&) {});
#endif
    }
    ctx->save_for_backward({logits});
    ctx->saved_data["tokens"] = tokens;
    ctx->saved_data["temperature"] = temperature;
    if (row_mask) ctx->saved_data["row_mask"] = *row_mask;
    ctx->saved_data["lse"] = lse;
    // A private copy of the entropy (N values): the caller may modify the returned one in place.
    ctx->saved_data["entropy"] = entropy.clone();
    // Undefined incoming gradients stay undefined: an unused output costs nothing in backward.
    ctx->set_materialize_grads(false);
    const std::vector<int64_t> out_shape(logits.sizes().begin(), logits.sizes().end() - 1);
    return {logp.view(out_shape), entropy.view(out_shape)};
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    if (at::GradMode::is_enabled())
      fail("logits", "reco::torch::token_logp_entropy does not provide second derivatives (create_graph=True)");
    const at::Tensor logits = ctx->get_saved_variables()[0];
    const row_blocks b = blocks_of(logits);
    const at::ScalarType acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    auto upstream = [&](const at::Tensor& g) -> at::Tensor {
      return g.defined() ? g.to(acc).contiguous().view({-1}) : at::Tensor();
    };
    const at::Tensor g_logp = upstream(grads[0]);
    const at::Tensor g_entropy = upstream(grads[1]);
    const std::vector<at::Tensor> none(3);
    if (!g_logp.defined() && !g_entropy.defined()) {
      std::vector<at::Tensor> out{at::Tensor()};
      out.insert(out.end(), none.begin(), none.end());
      return out;
    }
    // One tensor of the logits' shape (for logits without gaps): see gradient_layout_of.
    const gradient_layout gl = gradient_layout_of(logits, b);
    const at::Tensor dlogits = at::empty({gl.elements}, logits.options()).as_strided(logits.sizes(), gl.strides);
    const index_t N = b.rows();
    if (N > 0) {
      const at::Tensor tokens = ctx->saved_data["tokens"].toTensor();
      const auto mask_it = ctx->saved_data.find("row_mask");
      const at::Tensor lse = ctx->saved_data["lse"].toTensor();
      const at::Tensor entropy = ctx->saved_data["entropy"].toTensor();
      reco::logits::call c =
          input_call(logits, b, tokens, ctx->saved_data["temperature"].toDouble(),
                     mask_it != ctx->saved_data.end() ? mask_it->second.toTensor().data_ptr() : nullptr);
      c.grad_logp = g_logp.defined() ? g_logp.data_ptr() : nullptr;
      c.grad_entropy = g_entropy.defined() ? g_entropy.data_ptr() : nullptr;
      c.saved_lse = lse.data_ptr();
      c.saved_entropy = entropy.data_ptr();
      c.dlogits = dlogits.data_ptr();
#if RECO_TORCH_WITH_CUDA
      for_each_block(logits, c, b, gl.block_stride, reco::logits::backward_cpu,
                     [](const reco::logits::call& k) { detail::logits_backward_cuda(k); });
#else
      for_each_block(logits, c, b, gl.block_stride, reco::logits::backward_cpu, [](const reco::logits::call&) {});
#endif
    }
    std::vector<at::Tensor> out{dlogits};
    out.insert(out.end(), none.begin(), none.end());
    return out;
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> token_logp_entropy(const at::Tensor& logits, const at::Tensor& tokens,
                                                      double temperature, const at::Tensor& row_mask) {
  if (!logits.defined()) fail("logits", "is required");
  check_dense(logits, "logits");
  logit_type_of(logits);  // dtype and layout are checked before anything else
  blocks_of(logits);
  if (!logits.device().is_cpu() && !logits.device().is_cuda())
    fail("logits", "is on " + logits.device().str() + "; reco::torch runs on CPU and CUDA tensors");
  if (!std::isfinite(temperature) || temperature <= 0)
    fail("temperature", "must be finite and > 0, got " + std::to_string(temperature));
  const at::IntArrayRef row_shape = logits.sizes().slice(0, logits.dim() - 1);

  if (!tokens.defined()) fail("tokens", "is required");
  check_dense(tokens, "tokens");
  if (tokens.scalar_type() != at::kLong && tokens.scalar_type() != at::kInt)
    fail("tokens", std::string("must be int64 (or int32), got ") + c10::toString(tokens.scalar_type()));
  if (tokens.device() != logits.device())
    fail("tokens", "is on " + tokens.device().str() + " but logits are on " + logits.device().str());
  if (tokens.sizes() != row_shape)
    fail("tokens", "has shape " + shape_of(tokens.sizes()) + ", expected the logits' row shape " + shape_of(row_shape));
  const at::Tensor tok = tokens.to(at::kLong).contiguous();

  c10::optional<at::Tensor> mask;
  if (row_mask.defined()) {
    check_dense(row_mask, "row_mask");
    if (row_mask.scalar_type() != at::kBool && row_mask.scalar_type() != at::kByte)
      fail("row_mask", std::string("must be bool or uint8, got ") + c10::toString(row_mask.scalar_type()));
    if (row_mask.device() != logits.device())
      fail("row_mask", "is on " + row_mask.device().str() + " but logits are on " + logits.device().str());
    if (row_mask.sizes() != row_shape)
      fail("row_mask", "has shape " + shape_of(row_mask.sizes()) + ", expected the logits' row shape " +
                           shape_of(row_shape));
    mask = row_mask.contiguous();
  }
  auto outs = logp_entropy_function::apply(logits, tok, temperature, mask);
  return {outs[0], outs[1]};
}

}  // namespace torch
RECO_NAMESPACE_END
