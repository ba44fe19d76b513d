// Log-probability of the sampled token and entropy from the last hidden states and the lm_head,
// without the [N, V] logits: reco::logits::linear_forward / linear_backward / linear_fused
// (definitions and the exactness argument: docs/logits.md, "From hidden states").
//
// For row r of h [N, H], the lm_head W [V, H] and an optional bias [V], the logits are
// x_r = W h_r + bias; logp, entropy, lse and sum_p_squared are those of reco::logits::forward on
// x_r, and the backward turns dL/dlogp and dL/dentropy into dL/dh (written), dL/dW and dL/dbias
// (added to the caller's buffers). The rows are processed in chunks of C tokens: the chunk's
// logits tile [C, V] is one GEMM, reduced row by row by the reco::logits row kernels (scan_row,
// gradient_row), and in the backward its dlogits (computed in place, one rounding) become the
// chunk's dh and its contribution to dW by two more GEMMs before the next chunk. C is sized from a
// memory budget, so the extra memory is O(C·V + C·H), independent of N. The backward recomputes
// each chunk's logits but the last one's when the forward kept them (linear_kept_logits): with
// all rows in one chunk, forward and backward take three GEMMs, as a materialising call does.
//
// The GEMMs come from a `Gemm` object the caller passes (any BLAS; reco/logits/cblas_gemm.hpp
// adapts a CBLAS, the LibTorch adapter uses at::mm): for A = float and double,
//   gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
// computes the row-major C[m, n] = alpha op(A) op(B) + beta C, op(X) = X^T when trans_x.
//
// Types. h, W and bias share the storage type T (float, double, reco::bf16_t, reco::f16_t); the
// GEMMs, the reductions and every per-row value run in A = accum_t<T> (double for double, float
// otherwise). 16-bit operands are widened exactly into A blocks before their GEMM (a product of
// two bf16 or fp16 values is exact in float), so the GEMMs see the stored values. dh is rounded
// once to T (or written in A); dW and dbias are accumulated in A.
//
// Layouts. h[r, k] = hidden[r * s0 + k * s1] and W[v, k] = weight[v * t0 + k * t1] with any
// non-negative strides: the chunk's rows of h are always copied into a packed A buffer; W is read
// by the GEMM in place when T = A and one of its strides is 1 (row- or column-major, transposed
// views included), and otherwise widened block by block. Nothing is ever read through an overlap
// that changes the result: these are reads only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "reco/config.hpp"
#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace logits {

// The default memory budget of the chunked call's workspace: 256 MiB.
inline constexpr std::size_t default_linear_memory_budget = std::size_t(256) << 20;

template <class T>
struct linear_operands {
  const T* hidden = nullptr;  // h [rows, hidden_size]
  index_t rows = 0, hidden_size = 0;
  index_t hidden_stride_row = 0, hidden_stride_col = 1;  // 0 for the row stride: hidden_size
  const T* weight = nullptr;  // W [vocab, hidden_size]: this call's rows of the lm_head
  index_t vocab = 0;
  index_t weight_stride_row = 0, weight_stride_col = 1;  // 0 for the row stride: hidden_size
  const T* bias = nullptr;  // [vocab], stride bias_stride (nullable)
  index_t bias_stride = 1;
  const std::int64_t* tokens = nullptr;  // [rows] sampled ids in [0, total_vocab)
  const std::uint8_t* row_mask = nullptr;  // [rows] nullable: 0 = padding (never read, zero result)
  // Vocabulary-parallel: W holds ids [vocab_begin, vocab_begin + vocab) of total_vocab (0: vocab).
  index_t vocab_begin = 0, total_vocab = 0;
};

struct linear_options {
  double temperature = 1.0;
  std::size_t memory_budget = default_linear_memory_budget;  // bytes of workspace
  index_t chunk_rows = 0;  // > 0: rows per chunk, overriding what the budget allows
  bool sum_p_squared = false;  // forward: also compute Σ p² (an output only, no gradient)
  // Forward: refuse non-finite h, W or bias ("hidden", "weight", "bias") with one read of each.
  bool check_finite = true;
};

// The logits of the forward's last chunk, kept for the backward: linear_forward fills it
// (linear_outputs::keep), linear_backward takes it (linear_gradients::kept) and starts with that
// chunk, whose logits GEMM it then skips. Between the two calls it holds one tile of the workspace,
// C·V values of A (within memory_budget); the backward reuses the buffer as its own tile, so the
// two calls together still use one workspace at a time. The backward uses it only for a call on
// the forward's operands (the same pointers, shapes, strides, mask count and chunking) and
// recomputes otherwise. Like saved_lse it is the forward's: h, W and bias must not change between
// the calls. Callers only pass it along.
template <class A>
struct linear_kept_logits {
  struct call_key {
    const void *hidden = nullptr, *weight = nullptr, *bias = nullptr;
    index_t rows = 0, hidden_size = 0, vocab = 0, vocab_begin = 0;
    index_t hidden_strides[2] = {0, 0}, weight_strides[2] = {0, 0}, bias_stride = 0;
    index_t live_rows = 0, chunk_rows = 0, first_row = 0, count = 0;  // the chunk: rows of live order
    bool operator==(const call_key& o) const {
      return hidden == o.hidden && weight == o.weight && bias == o.bias && rows == o.rows &&
             hidden_size == o.hidden_size && vocab == o.vocab && vocab_begin == o.vocab_begin &&
             hidden_strides[0] == o.hidden_strides[0] && hidden_strides[1] == o.hidden_strides[1] &&
             weight_strides[0] == o.weight_strides[0] && weight_strides[1] == o.weight_strides[1] &&
             bias_stride == o.bias_stride && live_rows == o.live_rows && chunk_rows == o.chunk_rows &&
             first_row == o.first_row && count == o.count;
    }
  };
  std::unique_ptr<A[]> tile;
  call_key key;
  bool empty() const { return !tile; }
  std::size_t bytes() const { return tile ? static_cast<std::size_t>(key.chunk_rows * key.vocab) * sizeof(A) : 0; }
  void clear() { tile.reset(); }
};

// Per-row outputs (A = accum_t<T>), each nullable.
template <class A>
struct linear_outputs {
  A* logp = nullptr;
  A* entropy = nullptr;
  A* lse = nullptr;
  A* sum_p_squared = nullptr;
  linear_kept_logits<A>* keep = nullptr;  // linear_forward (CPU): keep the last chunk's logits (nullable)
};

// Backward inputs (upstream gradients nullable: zero) and outputs.
template <class T>
struct linear_gradients {
  using A = accum_t<T>;
  const A* grad_logp = nullptr;
  const A* grad_entropy = nullptr;  // null or all zero: the entropy's backward is skipped
  const A* saved_lse = nullptr;      // from the forward (linear_backward only)
  const A* saved_entropy = nullptr;  // from the forward, when grad_entropy is non-zero
  T* dhidden = nullptr;              // dh [rows, hidden_size], row stride dhidden_stride (0: H), written
  A* dhidden_accum = nullptr;        // ... or the same in A (at most one of the two; none: no dh)
  index_t dhidden_stride = 0;
  A* dweight = nullptr;  // [vocab, hidden_size] row stride dweight_stride (0: H); added to (nullable)
  index_t dweight_stride = 0;
  A* dbias = nullptr;  // [vocab], added to (nullable)
  linear_kept_logits<A>* kept = nullptr;  // linear_backward: the forward's kept logits, taken (nullable)
};

// The statistics of one row over this call's part of the vocabulary (relative to max_x, in logit
// units), and its sampled token's logit when the token lies in it (else exactly 0): what the
// ranks of a vocabulary-parallel call combine.
template <class A>
struct row_partial {
  detail::row_sums<A> sums;
  A token_logit;
};

// Merges the rows' partials of several parts of the vocabulary, in part order (the result equals
// one scan of the whole row up to the rounding of the moves). parts[p][i] is part p's row i.
template <class A>
void merge_partials(const row_partial<A>* const* parts, int part_count, index_t count, double temperature,
                    row_partial<A>* out) {
  const A k = static_cast<A>(detail::log2_e / temperature);
  for (index_t i = 0; i < count; ++i) {
    row_partial<A> m = parts[0][i];
    for (int p = 1; p < part_count; ++p) {
      m.sums = detail::merge_row_sums(m.sums, parts[p][i].sums, k);
      m.token_logit += parts[p][i].token_logit;  // the others' are exactly 0
    }
    out[i] = m;
  }
}

// Rows per chunk and weight rows per widened block for a call, and the workspace they use.
struct linear_chunking {
  index_t chunk_rows = 0;
  index_t weight_block_rows = 0;  // 0: W is read in place
  std::size_t workspace_bytes = 0;
};

// Workspace of a chunk of c rows: the logits tile c·V, h and dh c·H each, the ones vector and
// per-row values (10 per row: partials, outputs, upstream gradients) in A, a row index; plus the
// widened weight block b·H in A.
inline std::size_t linear_workspace_bytes(index_t c, index_t vocab, index_t hidden, index_t block, std::size_t a) {
  return static_cast<std::size_t>(c) * (a * static_cast<std::size_t>(vocab + 2 * hidden + 11) + 8) +
         static_cast<std::size_t>(block) * static_cast<std::size_t>(hidden) * a;
}

// The plan for rows x vocab x hidden with accumulation type of size `a` bytes. A weight that is
// widened gets blocks of at most half the budget (all of W when it fits there); the chunk gets the
// rest, at most `rows` and at least 1. Throws "memory_budget" when one row does not fit.
inline linear_chunking linear_chunking_of(index_t rows, index_t vocab, index_t hidden, std::size_t a, bool weight_widened,
                               std::size_t budget, index_t chunk_rows) {
  linear_chunking p;
  if (weight_widened) {
    const std::size_t per_weight_row = static_cast<std::size_t>(hidden) * a;
    const std::size_t fit = budget / 2 / per_weight_row;
    p.weight_block_rows = std::max<index_t>(1, static_cast<index_t>(std::min<std::size_t>(fit, static_cast<std::size_t>(vocab))));
  }
  const std::size_t one_row = linear_workspace_bytes(1, vocab, hidden, p.weight_block_rows, a);
  if (chunk_rows > 0) {
    p.chunk_rows = std::min(chunk_rows, std::max<index_t>(rows, 1));
  } else {
    if (budget < one_row)
      ::reco::detail::fail("memory_budget", std::to_string(budget) + " bytes cannot hold one token's row (" +
                                                std::to_string(one_row) + " bytes for V = " + std::to_string(vocab) +
                                                ", H = " + std::to_string(hidden) + ")");
    const std::size_t fixed = linear_workspace_bytes(0, vocab, hidden, p.weight_block_rows, a);
    const std::size_t per_row = linear_workspace_bytes(1, vocab, hidden, 0, a);
    p.chunk_rows = static_cast<index_t>(std::min<std::size_t>((budget - fixed) / per_row,
                                                              static_cast<std::size_t>(std::max<index_t>(rows, 1))));
  }
  p.workspace_bytes = linear_workspace_bytes(p.chunk_rows, vocab, hidden, p.weight_block_rows, a);
  return p;
}

// The device call's plan (reco/logits/linear_logp_entropy.cuh), host-side: rows per chunk and the
// offsets of its buffers in one caller-allocated workspace, each 256-byte aligned. Per chunk row:
// the logits tile (V in A), and for 16-bit inputs its dlogits rounded once to T for the backward
// GEMMs (V in T); the packed h row (H in T), the dh row (H in A) and one T of a ones vector.
struct linear_cuda_chunking {
  index_t chunk_rows = 0;
  std::size_t tile = 0, dlogits_t = 0, hidden = 0, dhidden = 0, ones = 0;  // byte offsets
  std::size_t workspace_bytes = 0;
};

inline linear_cuda_chunking linear_cuda_chunking_of(index_t rows, index_t vocab, index_t hidden, std::size_t t_size,
                                         std::size_t a_size, std::size_t budget, index_t chunk_rows) {
  constexpr std::size_t align = 256;
  auto layout = [&](index_t c) {
    linear_cuda_chunking p;
    p.chunk_rows = c;
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t start = at;
      at += (bytes + align - 1) / align * align;
      return start;
    };
    const std::size_t C = static_cast<std::size_t>(c), V = static_cast<std::size_t>(vocab),
                      H = static_cast<std::size_t>(hidden);
    p.tile = take(C * V * a_size);
    p.dlogits_t = take(t_size == a_size ? 0 : C * V * t_size);
    p.hidden = take(C * H * t_size);
    p.dhidden = take(C * H * a_size);
    p.ones = take(C * t_size);
    p.workspace_bytes = at;
    return p;
  };
  if (chunk_rows > 0) return layout(std::min(chunk_rows, std::max<index_t>(rows, 1)));
  const linear_cuda_chunking one = layout(1);
  if (budget < one.workspace_bytes)
    ::reco::detail::fail("memory_budget", std::to_string(budget) + " bytes cannot hold one token's row (" +
                                              std::to_string(one.workspace_bytes) + " bytes on the device)");
  // The largest chunk within the budget (at most rows): per-row bytes bound it, alignment decides.
  const std::size_t per_row = static_cast<std::size_t>(vocab) * (a_size + (t_size == a_size ? 0 : t_size)) +
                              static_cast<std::size_t>(hidden) * (t_size + a_size) + t_size;
  index_t c = static_cast<index_t>(std::min<std::size_t>(budget / per_row, static_cast<std::size_t>(std::max<index_t>(rows, 1))));
  c = std::max<index_t>(c, 1);
  while (c > 1 && layout(c).workspace_bytes > budget) --c;
  return layout(c);
}

namespace detail {

template <class T>
inline bool finite_value(T v) {
  return std::isfinite(static_cast<accum_t<T>>(v));
}

// Whether the n values p[0], p[stride], ... are all finite. Unit stride in float or double tests
// the exponent bits with integer operations and no early exit, which vectorises: the check reads
// all of W once per forward, and a scalar std::isfinite there costs as much as a tenth of the call.
template <class T>
inline bool all_finite(const T* p, index_t n, index_t stride) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (stride == 1) {
      using bits_t = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;
      constexpr bits_t exponent = std::is_same_v<T, float> ? bits_t(0x7f800000u) : bits_t(0x7ff0000000000000ull);
      bits_t bad = 0;
      for (index_t k = 0; k < n; ++k) {
        bits_t b;
        std::memcpy(&b, p + k, sizeof b);
        bad |= static_cast<bits_t>((b & exponent) == exponent);
      }
      return bad == 0;
    }
  }
  bool ok = true;
  for (index_t k = 0; k < n; ++k) ok &= finite_value(p[k * stride]);
  return ok;
}

enum class linear_mode { forward, backward, fused };

// No reduction across ranks: this call holds the whole vocabulary.
struct no_partial_reduce {
  template <class A>
  void operator()(row_partial<A>*, index_t) const {}
};

// The pass shared by the three calls. grad_fn (fused mode) turns the chunk's logp and entropy into
// their upstream gradients; reduce combines the chunk's partials across vocabulary shards.
template <class T, class Gemm, class GradFn, class Reduce>
void linear_pass(linear_mode mode, const Gemm& gemm, const linear_operands<T>& in, const linear_options& opt,
                 const linear_outputs<accum_t<T>>& out, const linear_gradients<T>& gr, GradFn&& grad_fn,
                 Reduce&& reduce) {
  using A = accum_t<T>;
  using ::reco::detail::fail;
  using ::reco::detail::require;
  static_assert(is_logit_type_v<T>, "reco::logits: h and W must be float, double, reco::bf16_t or reco::f16_t");
  const index_t N = in.rows, H = in.hidden_size, V = in.vocab;
  const index_t total_vocab = in.total_vocab > 0 ? in.total_vocab : V;
  const bool forward_stats = mode != linear_mode::backward;
  const bool backward = mode != linear_mode::forward;

  // ---- arguments
  require(N >= 0, "rows", "must be >= 0, got " + std::to_string(N));
  require(H >= 1, "hidden_size", "must be >= 1, got " + std::to_string(H));
  require(V >= 1, "vocab", "must be >= 1, got " + std::to_string(V));
  require(in.vocab_begin >= 0 && in.vocab_begin + V <= total_vocab, "vocab_begin",
          "this part [" + std::to_string(in.vocab_begin) + ", " + std::to_string(in.vocab_begin + V) +
              ") is not inside [0, total_vocab = " + std::to_string(total_vocab) + ")");
  const index_t hs0 = in.hidden_stride_row > 0 ? in.hidden_stride_row : H, hs1 = in.hidden_stride_col;
  const index_t ws0 = in.weight_stride_row > 0 ? in.weight_stride_row : H, ws1 = in.weight_stride_col;
  require(hs1 >= 0 && in.hidden_stride_row >= 0, "hidden", "strides must be >= 0");
  require(ws1 >= 0 && in.weight_stride_row >= 0, "weight", "strides must be >= 0");
  require(in.bias_stride >= 0, "bias", "stride must be >= 0");
  require(in.hidden != nullptr || N == 0, "hidden", "is null");
  require(in.weight != nullptr, "weight", "is null");
  require(std::isfinite(opt.temperature) && opt.temperature > 0, "temperature",
          "must be finite and > 0, got " + std::to_string(opt.temperature));
  check_temperature_range<A>(opt.temperature);
  require(in.tokens != nullptr || N == 0, "tokens", "is null");
  check_tokens(in.tokens, N, total_vocab, in.row_mask);
  if (backward) {
    require(gr.dhidden == nullptr || gr.dhidden_accum == nullptr, "dhidden",
            "give dhidden or dhidden_accum, not both");
    require(gr.dhidden_stride == 0 || gr.dhidden_stride >= H, "dhidden_stride", "must be 0 or >= hidden_size");
    require(gr.dweight_stride == 0 || gr.dweight_stride >= H, "dweight_stride", "must be 0 or >= hidden_size");
  }
  if (mode == linear_mode::backward) require(gr.saved_lse != nullptr || N == 0, "saved_lse", "is null (pass the forward's lse)");
  if (N == 0) return;

  // ---- the entropy's backward is skipped when its upstream gradient is null or zero
  bool entropy_grad = false;
  if (mode == linear_mode::backward && gr.grad_entropy) {
    for (index_t r = 0; r < N && !entropy_grad; ++r)
      entropy_grad = (!in.row_mask || in.row_mask[r]) && gr.grad_entropy[r] != A(0);
    require(!entropy_grad || gr.saved_entropy != nullptr, "saved_entropy",
            "is null but grad_entropy is non-zero (pass the forward's entropy)");
  }
  const bool logp_grad = mode == linear_mode::fused || gr.grad_logp != nullptr;
  if (mode == linear_mode::backward && !logp_grad && !entropy_grad) {
    // Nothing flows back: dh is zero, dW and dbias are unchanged.
    const index_t dhs = gr.dhidden_stride > 0 ? gr.dhidden_stride : H;
    for (index_t r = 0; r < N; ++r)
      for (index_t k = 0; k < H; ++k) {
        if (gr.dhidden) gr.dhidden[r * dhs + k] = narrow<T>(A(0));
        else if (gr.dhidden_accum) gr.dhidden_accum[r * dhs + k] = A(0);
      }
    return;
  }

  // ---- finiteness of the inputs (forward): 16-bit weights are checked as they are widened
  // In place when T = A and W is row-major (unit column stride, rows apart by >= H) or
  // column-major (unit row stride, columns apart by >= V); otherwise widened block by block.
  const bool weight_row_major = ws1 == 1 && (ws0 >= H || V == 1);
  const bool weight_col_major = !weight_row_major && ws0 == 1 && (ws1 >= V || H == 1);
  const bool weight_in_place = std::is_same_v<T, A> && (weight_row_major || weight_col_major);
  if (forward_stats && opt.check_finite) {
    for (index_t r = 0; r < N; ++r) {
      if (in.row_mask && !in.row_mask[r]) continue;
      for (index_t k = 0; k < H; ++k)
        if (!finite_value(in.hidden[r * hs0 + k * hs1]))
          fail("hidden", "row " + std::to_string(r) + " has a non-finite value");
    }
    if (weight_in_place) {
      // One read of W in parallel, without an early exit (all_finite vectorises). Column-major W
      // is read by columns, its contiguous runs; its rows are scanned for the first bad one only
      // when a column holds a non-finite value.
      bool scan_rows = true;
      if (weight_col_major) {
        bool finite = true;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(&& : finite) if (V * H >= (index_t(1) << 20))
#endif
        for (index_t k = 0; k < H; ++k) finite = all_finite(in.weight + k * ws1, V, 1) && finite;
        scan_rows = !finite;
      }
      index_t first_bad = V;
      if (scan_rows) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first_bad) if (V * H >= (index_t(1) << 20))
#endif
        for (index_t v = 0; v < V; ++v)
          if (!all_finite(in.weight + v * ws0, H, ws1)) first_bad = std::min(first_bad, v);
      }
      if (first_bad < V) fail("weight", "row " + std::to_string(first_bad) + " has a non-finite value");
    }
    if (in.bias)
      for (index_t v = 0; v < V; ++v)
        if (!finite_value(in.bias[v * in.bias_stride])) fail("bias", "entry " + std::to_string(v) + " is not finite");
  }

  // ---- plan and workspace
  const linear_chunking plan = linear_chunking_of(N, V, H, sizeof(A), !weight_in_place, opt.memory_budget, opt.chunk_rows);
  const index_t C = plan.chunk_rows, B = weight_in_place ? V : plan.weight_block_rows;

  // The unmasked rows in order, cut into chunks of C; the first chunk takes the remainder, so the
  // last one, which the forward can keep and the backward (last chunk first) then starts with,
  // is a whole chunk.
  std::vector<index_t> live;
  live.reserve(static_cast<std::size_t>(N));
  for (index_t r = 0; r < N; ++r)
    if (!in.row_mask || in.row_mask[r]) live.push_back(r);
  const index_t live_rows = static_cast<index_t>(live.size());
  const index_t chunks = (live_rows + C - 1) / C;
  const index_t first_chunk_rows = live_rows - (chunks - 1) * C;
  auto chunk_begin = [&](index_t j) { return j == 0 ? index_t(0) : first_chunk_rows + (j - 1) * C; };
  auto key_of_chunk = [&](index_t j) {
    typename linear_kept_logits<A>::call_key k;
    k.hidden = in.hidden, k.weight = in.weight, k.bias = in.bias;
    k.rows = N, k.hidden_size = H, k.vocab = V, k.vocab_begin = in.vocab_begin;
    k.hidden_strides[0] = hs0, k.hidden_strides[1] = hs1, k.weight_strides[0] = ws0, k.weight_strides[1] = ws1;
    k.bias_stride = in.bias ? in.bias_stride : 0;
    k.live_rows = live_rows, k.chunk_rows = C;
    k.first_row = chunks > 0 ? live[static_cast<std::size_t>(chunk_begin(j))] : 0;
    k.count = j == 0 ? first_chunk_rows : C;
    return k;
  };
  // The backward takes the forward's kept tile (freed at the end of this call either way) and
  // uses it when it belongs to this call's last chunk.
  std::unique_ptr<A[]> tile;
  bool tile_kept = false;
  if (mode == linear_mode::backward && gr.kept) {
    if (!gr.kept->empty() && chunks > 0 && gr.kept->key == key_of_chunk(chunks - 1)) {
      tile = std::move(gr.kept->tile);
      tile_kept = true;
    }
    gr.kept->clear();
  }
  if (!tile) tile.reset(new A[static_cast<std::size_t>(C * V)]);
  std::unique_ptr<A[]> hc(new A[static_cast<std::size_t>(C * H)]);
  const bool want_dh = backward && (gr.dhidden || gr.dhidden_accum);
  std::unique_ptr<A[]> dhc(want_dh ? new A[static_cast<std::size_t>(C * H)] : nullptr);
  std::unique_ptr<A[]> wblock(weight_in_place ? nullptr : new A[static_cast<std::size_t>(B * H)]);
  std::unique_ptr<A[]> ones(backward && gr.dbias ? new A[static_cast<std::size_t>(C)] : nullptr);
  std::unique_ptr<A[]> row_values(new A[static_cast<std::size_t>(C * 4)]);
  std::unique_ptr<row_partial<A>[]> partials(new row_partial<A>[static_cast<std::size_t>(C)]);
  if (ones) std::fill(ones.get(), ones.get() + C, A(1));
  A* c_logp = row_values.get();
  A* c_entropy = c_logp + C;
  A* c_glogp = c_entropy + C;
  A* c_gentropy = c_glogp + C;

  const A inv_tau = static_cast<A>(1.0 / opt.temperature);
  const A tau = static_cast<A>(opt.temperature);
  const A k2 = static_cast<A>(log2_e / opt.temperature);
  const A ln2 = static_cast<A>(ln_2);
  const A c1_scale = static_cast<A>(ln_2 / opt.temperature);
  const index_t dhs = gr.dhidden_stride > 0 ? gr.dhidden_stride : H;
  const index_t dws = gr.dweight_stride > 0 ? gr.dweight_stride : H;

  // The weight rows [v0, v0 + n) as a GEMM operand: a pointer, whether it is stored row-major
  // ([n, H], leading dimension ld) or column-major (W^T [H, n]), widened first when needed.
  struct weight_view {
    const A* p;
    bool row_major;
    index_t ld;
  };
  auto weight_rows = [&](index_t v0, index_t n) -> weight_view {
    if constexpr (std::is_same_v<T, A>) {
      if (weight_in_place) {
        if (weight_row_major) return {in.weight + v0 * ws0, true, std::max(ws0, H)};
        return {in.weight + v0, false, std::max(ws1, V)};  // column-major: W^T [H, V]
      }
    }
    bool finite = true;
    A* w = wblock.get();
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(&& : finite) if (n * H >= (index_t(1) << 16))
#endif
    for (index_t v = 0; v < n; ++v)
      for (index_t k = 0; k < H; ++k) {
        const A x = static_cast<A>(in.weight[(v0 + v) * ws0 + k * ws1]);
        finite = finite && std::isfinite(x);
        w[v * H + k] = x;
      }
    if (!finite && forward_stats && opt.check_finite)
      fail("weight", "rows [" + std::to_string(v0) + ", " + std::to_string(v0 + n) + ") hold a non-finite value");
    return {w, true, H};
  };
  const index_t y_none = -1;
  auto local_token = [&](index_t r) -> index_t {
    const index_t y = static_cast<index_t>(in.tokens[r]) - in.vocab_begin;
    return y >= 0 && y < V ? y : y_none;
  };

  // Logits of the chunk's n rows for the weight rows [v0, v0 + nb) into tile columns v0..: GEMM, bias.
  auto logits_block = [&](index_t n, index_t v0, index_t nb, const weight_view& w) {
    gemm(false, w.row_major, n, nb, H, A(1), hc.get(), H, w.p, w.ld, A(0), tile.get() + v0, V);
    if (in.bias)
      for (index_t i = 0; i < n; ++i) {
        A* x = tile.get() + i * V + v0;
        for (index_t j = 0; j < nb; ++j) x[j] += static_cast<A>(in.bias[(v0 + j) * in.bias_stride]);
      }
  };
  // dh (+)= dX[:, block] W_block, dW[block] += dX[:, block]^T h, dbias[block] += column sums.
  auto backward_block = [&](index_t n, index_t v0, index_t nb, const weight_view& w, bool first) {
    if (want_dh) gemm(false, !w.row_major, n, H, nb, A(1), tile.get() + v0, V, w.p, w.ld, first ? A(0) : A(1), dhc.get(), H);
    if (gr.dweight) gemm(true, false, nb, H, n, A(1), tile.get() + v0, V, hc.get(), H, A(1), gr.dweight + v0 * dws, dws);
    if (gr.dbias) gemm(true, false, nb, 1, n, A(1), tile.get() + v0, V, ones.get(), 1, A(1), gr.dbias + v0, 1);
  };

  index_t first_overflow = N, first_temperature = N;
  // Masked rows: zero outputs and dh, never read.
  for (index_t r = 0; r < N; ++r) {
    if (!in.row_mask || in.row_mask[r]) continue;
    if (out.logp) out.logp[r] = 0;
    if (out.entropy) out.entropy[r] = 0;
    if (out.lse) out.lse[r] = 0;
    if (out.sum_p_squared) out.sum_p_squared[r] = 0;
    if (backward)
      for (index_t k = 0; k < H; ++k) {
        if (gr.dhidden) gr.dhidden[r * dhs + k] = narrow<T>(A(0));
        else if (gr.dhidden_accum) gr.dhidden_accum[r * dhs + k] = A(0);
      }
  }
  for (index_t step = 0; step < chunks; ++step) {
    // The chunk: its rows packed into hc. The backward goes from the last chunk to the first.
    const index_t j = mode == linear_mode::backward ? chunks - 1 - step : step;
    const index_t* rows = live.data() + chunk_begin(j);
    const index_t n = j == 0 ? first_chunk_rows : C;
    const bool recompute = !(tile_kept && step == 0);
    const bool threads = worth_threads(n, V);
    for (index_t i = 0; i < n; ++i)
      for (index_t k = 0; k < H; ++k) hc[i * H + k] = static_cast<A>(in.hidden[rows[i] * hs0 + k * hs1]);

    if (forward_stats) {
      for (index_t v0 = 0; v0 < V; v0 += B) logits_block(n, v0, std::min(B, V - v0), weight_rows(v0, std::min(B, V - v0)));
      // The chunk's partial statistics, combined across vocabulary shards, then finished.
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (threads)
#endif
      for (index_t i = 0; i < n; ++i) {
        const A* x = tile.get() + i * V;
        partials[i].sums = opt.sum_p_squared ? scan_row<A, true>(x, V, k2) : scan_row<A, false>(x, V, k2);
        const index_t y = local_token(rows[i]);
        partials[i].token_logit = y == y_none ? A(0) : x[y];
      }
      reduce(partials.get(), n);
      for (index_t i = 0; i < n; ++i) {
        const index_t r = rows[i];
        const row_sums<A>& t = partials[i].sums;
        // Finite h and W can still give an infinite or NaN logit by overflow of their products.
        if (!(t.max_x < std::numeric_limits<A>::infinity()) || !(t.s > 0)) {
          first_overflow = std::min(first_overflow, r);
          c_logp[i] = c_entropy[i] = std::numeric_limits<A>::quiet_NaN();
          continue;
        }
        const A log_s = std::log(t.s);
        const A h = log_s - ln2 * t.u / t.s;
        const A row_lse = t.max_x * inv_tau + log_s;
        if (!(std::abs(row_lse) < std::numeric_limits<A>::infinity())) {
          first_temperature = std::min(first_temperature, r);
          c_logp[i] = c_entropy[i] = std::numeric_limits<A>::quiet_NaN();
          continue;
        }
        c_logp[i] = (partials[i].token_logit - t.max_x) * inv_tau - log_s;
        c_entropy[i] = h < 0 ? A(0) : h;
        partials[i].sums.max_x = row_lse;  // kept for the fused backward below
        if (out.logp) out.logp[r] = c_logp[i];
        if (out.entropy) out.entropy[r] = c_entropy[i];
        if (out.lse) out.lse[r] = row_lse;
        if (out.sum_p_squared) out.sum_p_squared[r] = t.w / (t.s * t.s);
      }
      if (first_overflow < N)
        fail("hidden", "row " + std::to_string(first_overflow) +
                           ": a logit h·W^T (+ bias) overflows the accumulation type (or is NaN)");
      if (first_temperature < N)
        fail("temperature", "row " + std::to_string(first_temperature) + ": logits / temperature (" +
                                std::to_string(opt.temperature) + ") overflow the accumulation type");
    }
    if (!backward) continue;

    // Upstream gradients of the chunk's rows.
    if (mode == linear_mode::fused) {
      grad_fn(rows, n, static_cast<const A*>(c_logp), static_cast<const A*>(c_entropy), c_glogp, c_gentropy);
    } else {
      for (index_t i = 0; i < n; ++i) {
        c_glogp[i] = gr.grad_logp ? gr.grad_logp[rows[i]] : A(0);
        c_gentropy[i] = entropy_grad ? gr.grad_entropy[rows[i]] : A(0);
        c_entropy[i] = entropy_grad ? gr.saved_entropy[rows[i]] : A(0);
      }
    }
    // dlogits of the rows of one block of columns, in place in the tile (one rounding, in A).
    auto gradient_block = [&](index_t v0, index_t nb) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (threads)
#endif
      for (index_t i = 0; i < n; ++i) {
        const index_t r = rows[i];
        const A lse = mode == linear_mode::backward ? gr.saved_lse[r] : partials[i].sums.max_x;
        const A g = c_glogp[i], g_h = c_gentropy[i], h = g_h != A(0) ? c_entropy[i] : A(0);
        const gradient_coefficients<A> c{lse * tau, k2, -(g + g_h * h) * inv_tau, -g_h * c1_scale, g * inv_tau};
        const index_t y = local_token(r);
        const index_t y_block = y != y_none && y >= v0 && y < v0 + nb ? y - v0 : y_none;
        A* x = tile.get() + i * V + v0;
        if (lse != lse) std::fill(x, x + nb, std::numeric_limits<A>::quiet_NaN());
        else gradient_row<A>(x, x, nb, y_block, c);
      }
    };
    if (mode == linear_mode::backward) {
      // Block by block: recompute the block's logits, turn them into dlogits, use them.
      for (index_t v0 = 0; v0 < V; v0 += B) {
        const index_t nb = std::min(B, V - v0);
        const weight_view w = weight_rows(v0, nb);
        if (recompute) logits_block(n, v0, nb, w);
        gradient_block(v0, nb);
        backward_block(n, v0, nb, w, v0 == 0);
      }
    } else {
      gradient_block(0, V);
      for (index_t v0 = 0; v0 < V; v0 += B) {
        const index_t nb = std::min(B, V - v0);
        backward_block(n, v0, nb, weight_rows(v0, nb), v0 == 0);
      }
    }
    if (want_dh)
      for (index_t i = 0; i < n; ++i)
        for (index_t k = 0; k < H; ++k) {
          if (gr.dhidden) gr.dhidden[rows[i] * dhs + k] = narrow<T>(dhc[i * H + k]);
          else gr.dhidden_accum[rows[i] * dhs + k] = dhc[i * H + k];
        }
  }
  // The forward's last chunk: its tile still holds the chunk's logits (the scan only reads them).
  if (mode == linear_mode::forward && out.keep) {
    out.keep->clear();
    if (chunks > 0) {
      out.keep->tile = std::move(tile);
      out.keep->key = key_of_chunk(chunks - 1);
    }
  }
}

}  // namespace detail

// Forward: logp, entropy, lse (and sum_p_squared when options.sum_p_squared) of every row, and
// with out.keep the last chunk's logits for the backward (emptied first).
// `reduce` (vocabulary-parallel) gets each chunk's row_partial array and its length and must
// replace it with the merge over all shards (see merge_partials); the default does nothing.
template <class T, class Gemm, class Reduce = detail::no_partial_reduce>
void linear_forward(const Gemm& gemm, const linear_operands<T>& in, const linear_options& options,
                    const linear_outputs<accum_t<T>>& out, Reduce&& reduce = {}) {
  if (out.keep) out.keep->clear();
  ::reco::detail::require(out.logp == nullptr || in.tokens != nullptr || in.rows == 0, "tokens",
                          "is null but logp is requested");
  detail::linear_pass(detail::linear_mode::forward, gemm, in, options, out, linear_gradients<T>{},
                      [](auto&&...) {}, reduce);
}

// Backward from the forward's saved lse (and entropy): dh written, dW and dbias added to; the
// forward's kept logits (grads.kept) are used when they are this call's and emptied in any case.
// In a vocabulary-parallel call every rank's dh is its shard's part: the sum over ranks is dh.
template <class T, class Gemm>
void linear_backward(const Gemm& gemm, const linear_operands<T>& in, const linear_options& options,
                     const linear_gradients<T>& grads) {
  detail::linear_pass(detail::linear_mode::backward, gemm, in, options, linear_outputs<accum_t<T>>{}, grads,
                      [](auto&&...) {}, detail::no_partial_reduce{});
  if (grads.kept) grads.kept->clear();
}

// Forward and backward in one pass, each chunk's logits computed once: after the chunk's logp and
// entropy, grad_fn(rows, n, logp, entropy, grad_logp, grad_entropy) gives their upstream
// gradients (rows: the chunk's n row indices; logp, entropy: their values; it writes the two
// gradients of those n rows), for a loss whose gradient at a token needs only that token's values
// (and data known beforehand). grads.grad_logp / grad_entropy / saved_* are not used.
template <class T, class Gemm, class GradFn, class Reduce = detail::no_partial_reduce>
void linear_fused(const Gemm& gemm, const linear_operands<T>& in, const linear_options& options,
                  const linear_outputs<accum_t<T>>& out, const linear_gradients<T>& grads, GradFn&& grad_fn,
                  Reduce&& reduce = {}) {
  detail::linear_pass(detail::linear_mode::fused, gemm, in, options, out, grads, grad_fn, reduce);
}

}  // namespace logits
RECO_NAMESPACE_END
