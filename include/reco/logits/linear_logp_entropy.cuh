// The device version of reco/logits/linear_logp_entropy.hpp: logp and entropy from hidden states
// and the lm_head on device pointers, cuBLAS GEMMs and the reco::logits CUDA row kernels, on the
// caller's stream. Requires nvcc and cuBLAS (CUDA::cublas).
//
//   namespace rl = reco::logits;
//   const auto plan = rl::linear_cuda_chunking_of(N, V, H, sizeof(T), sizeof(rl::accum_t<T>), budget, 0);
//   // workspace: plan.workspace_bytes of device memory (stream-ordered, e.g. cudaMallocAsync)
//   rl::linear_forward_cuda(handle, in, options, out, workspace, plan, stream);   // in: device pointers
//   rl::linear_backward_cuda(handle, in, options, grads, workspace, plan, stream);
//
// Per chunk of C rows (masked rows included, as zero rows: the kernels skip them and their dlogits
// rows are 0, so they add nothing to dW and their h is never read):
//   1. a kernel packs the chunk's rows of h into a [C, H] buffer of T (masked rows 0);
//   2. cublasGemmEx: tile = h_chunk W^T in A (fp32 accumulation, fp32 output for 16-bit inputs:
//      the logits are never rounded to 16 bits), after a kernel filled the tile with the bias;
//   3. forward_cuda / backward_cuda of reco/logits/logp_entropy.cuh on the fp32 tile (in place in
//      the backward: dlogits in A, computed once);
//   4. backward: for 16-bit inputs a kernel rounds dlogits once to T (cuBLAS takes both operands of
//      one type); cublasGemmEx dh_chunk = dX W and dW += dX^T h_chunk (A output, the caller's dW),
//      dbias += dX^T 1; a kernel writes dh_chunk's rows (rounded once to T).
// Everything is enqueued on `stream` (the handle is set to it); nothing synchronises or allocates.
// W is read in place by cuBLAS when it is row- or column-major; other layouts are refused
// ("weight"). Vocabulary shards are not supported on the device yet ("vocab_begin").
// Errors in device data (tokens out of range, non-finite logits) set bits of error_flags as the
// logits kernels do; h, W and bias are not checked for finiteness on the device.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "reco/config.hpp"
#include "reco/detail/cuda_check.cuh"
#include "reco/logits/linear_logp_entropy.hpp"
#include "reco/logits/logp_entropy.cuh"

RECO_NAMESPACE_BEGIN
namespace logits {
namespace cuda_linear_detail {

inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("reco: cuBLAS error ") + std::to_string(static_cast<int>(s)) + " in " + what);
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, bf16_t>) return CUDA_R_16BF;
  else return CUDA_R_16F;
}

// Row-major C[m, n] (type A) = alpha op(A) op(B) + beta C with A, B of type T: cuBLAS is
// column-major, so this is C^T = op(B)^T op(A)^T.
template <class T, class A>
void gemm(cublasHandle_t h, bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const T* a, index_t lda,
          const T* b, index_t ldb, A beta, A* c, index_t ldc) {
  const A alpha = 1;
  const cublasComputeType_t compute = std::is_same_v<A, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  cublas_check(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, cuda_type<T>(),
                            static_cast<int>(ldb), a, cuda_type<T>(), static_cast<int>(lda), &beta, c, cuda_type<A>(),
                            static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

template <class T>
__global__ void pack_rows(const T* h, index_t s0, index_t s1, index_t first, index_t n, index_t H,
                          const std::uint8_t* mask, T* out) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < n * H;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t r = first + i / H, k = i % H;
    out[i] = (mask && !mask[r]) ? T(0.0f) : h[r * s0 + k * s1];
  }
}

// Every row of the tile set to the bias (or 0), before the logits GEMM adds h W^T (beta = 1).
template <class T, class A>
__global__ void fill_bias(A* tile, index_t n, index_t V, const T* bias, index_t bias_stride) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < n * V;
       i += static_cast<index_t>(gridDim.x) * blockDim.x)
    tile[i] = bias ? static_cast<A>(bias[(i % V) * bias_stride]) : A(0);
}

template <class T, class A>
__global__ void narrow_copy(const A* in, T* out, index_t count) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<index_t>(gridDim.x) * blockDim.x)
    out[i] = T(in[i]);
}

template <class T>
__global__ void fill_value(T* out, index_t count, float v) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<index_t>(gridDim.x) * blockDim.x)
    out[i] = T(v);
}

// dh rows [first, first + n) from the chunk's dh in A (stride H), rounded once to T; masked rows 0.
template <class T, class A>
__global__ void write_dh(const A* dhc, index_t first, index_t n, index_t H, const std::uint8_t* mask, T* dh,
                         index_t dh_stride) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < n * H;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t r = first + i / H, k = i % H;
    dh[r * dh_stride + k] = (mask && !mask[r]) ? T(0.0f) : T(dhc[i]);
  }
}

inline unsigned grid_for(index_t count) {
  const index_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

template <class T>
struct device_call {
  using A = accum_t<T>;
  const linear_operands<T>& in;
  const linear_options& opt;
  const linear_cuda_chunking& plan;
  cublasHandle_t handle;
  cudaStream_t stream;
  char* ws;
  bool w_row_major = true;
  index_t w_ld = 0;

  A* tile() const { return reinterpret_cast<A*>(ws + plan.tile); }
  T* dx_t() const { return std::is_same_v<T, A> ? reinterpret_cast<T*>(tile()) : reinterpret_cast<T*>(ws + plan.dlogits_t); }
  T* hc() const { return reinterpret_cast<T*>(ws + plan.hidden); }
  A* dhc() const { return reinterpret_cast<A*>(ws + plan.dhidden); }
  T* ones() const { return reinterpret_cast<T*>(ws + plan.ones); }

  void check() {
    using ::reco::detail::require;
    const index_t H = in.hidden_size, V = in.vocab;
    require(H >= 1, "hidden_size", "must be >= 1");
    require(V >= 1, "vocab", "must be >= 1");
    require(in.rows >= 0, "rows", "must be >= 0");
    require(in.weight != nullptr, "weight", "is null");
    require(in.hidden != nullptr || in.rows == 0, "hidden", "is null");
    require(in.tokens != nullptr || in.rows == 0, "tokens", "is null");
    require(in.vocab_begin == 0 && (in.total_vocab == 0 || in.total_vocab == V), "vocab_begin",
            "vocabulary shards are not supported by the device call yet");
    require(ws != nullptr || in.rows == 0, "workspace", "is null");
    const index_t t0 = in.weight_stride_row > 0 ? in.weight_stride_row : H, t1 = in.weight_stride_col;
    if (t1 == 1 && (t0 >= H || V == 1)) {
      w_row_major = true, w_ld = std::max(t0, H);
    } else if (t0 == 1 && (t1 >= V || H == 1)) {
      w_row_major = false, w_ld = std::max(t1, V);
    } else {
      ::reco::detail::fail("weight", "must be row-major or column-major (one stride 1) for the device call");
    }
    cublas_check(cublasSetStream(handle, stream), "cublasSetStream");
  }

  // The tile of rows [first, first + n): packed h, bias, GEMM.
  void logits(index_t first, index_t n) {
    const index_t H = in.hidden_size, V = in.vocab;
    const index_t s0 = in.hidden_stride_row > 0 ? in.hidden_stride_row : H;
    pack_rows<T><<<grid_for(n * H), 256, 0, stream>>>(in.hidden, s0, in.hidden_stride_col, first, n, H, in.row_mask, hc());
    fill_bias<T, A><<<grid_for(n * V), 256, 0, stream>>>(tile(), n, V, in.bias, in.bias_stride);
    ::reco::detail::cuda_check(cudaGetLastError(), "linear_logp_entropy kernels");
    gemm<T, A>(handle, false, w_row_major, n, V, H, hc(), H, in.weight, w_ld, A(1), tile(), V);
  }
};

}  // namespace cuda_linear_detail

// Forward on the device: logp, entropy, lse (and sum_p_squared when options.sum_p_squared).
// It keeps no logits for the backward (out.keep, if given, is emptied).
template <class T>
void linear_forward_cuda(cublasHandle_t handle, const linear_operands<T>& in, const linear_options& options,
                         const linear_outputs<accum_t<T>>& out, void* workspace, const linear_cuda_chunking& plan,
                         cudaStream_t stream, int* error_flags = nullptr) {
  static_assert(is_logit_type_v<T>, "reco::logits: h and W must be float, double, reco::bf16_t or reco::f16_t");
  if (out.keep) out.keep->clear();
  cuda_linear_detail::device_call<T> d{in, options, plan, handle, stream, static_cast<char*>(workspace)};
  d.check();
  for (index_t first = 0; first < in.rows; first += plan.chunk_rows) {
    const index_t n = std::min(plan.chunk_rows, in.rows - first);
    d.logits(first, n);
    auto at = [&](accum_t<T>* p) { return p ? p + first : nullptr; };
    forward_cuda<accum_t<T>>(d.tile(), n, in.vocab, in.vocab, in.tokens + first, options.temperature,
                             in.row_mask ? in.row_mask + first : nullptr, at(out.logp), at(out.entropy), at(out.lse),
                             stream, options.sum_p_squared ? at(out.sum_p_squared) : nullptr, error_flags);
  }
}

// Backward on the device from the forward's lse and entropy: dh written (T; or dhidden_accum in
// A), dW and dbias (A) added to.
template <class T>
void linear_backward_cuda(cublasHandle_t handle, const linear_operands<T>& in, const linear_options& options,
                          const linear_gradients<T>& g, void* workspace, const linear_cuda_chunking& plan,
                          cudaStream_t stream, int* error_flags = nullptr) {
  using A = accum_t<T>;
  namespace cd = cuda_linear_detail;
  if (g.kept) g.kept->clear();  // the device forward keeps nothing: every chunk is recomputed
  cd::device_call<T> d{in, options, plan, handle, stream, static_cast<char*>(workspace)};
  d.check();
  ::reco::detail::require(g.saved_lse != nullptr || in.rows == 0, "saved_lse", "is null (pass the forward's lse)");
  ::reco::detail::require(g.grad_entropy == nullptr || g.saved_entropy != nullptr, "saved_entropy",
                          "is null but grad_entropy is given");
  ::reco::detail::require(g.dhidden == nullptr || g.dhidden_accum == nullptr, "dhidden", "give dhidden or dhidden_accum, not both");
  const index_t H = in.hidden_size, V = in.vocab;
  const index_t dhs = g.dhidden_stride > 0 ? g.dhidden_stride : H, dws = g.dweight_stride > 0 ? g.dweight_stride : H;
  if (g.dbias) cd::fill_value<T><<<cd::grid_for(plan.chunk_rows), 256, 0, stream>>>(d.ones(), plan.chunk_rows, 1.0f);
  for (index_t first = 0; first < in.rows; first += plan.chunk_rows) {
    const index_t n = std::min(plan.chunk_rows, in.rows - first);
    d.logits(first, n);
    auto at = [&](const A* p) { return p ? p + first : nullptr; };
    backward_cuda<A>(d.tile(), n, V, V, in.tokens + first, options.temperature, in.row_mask ? in.row_mask + first : nullptr,
                     at(g.grad_logp), at(g.grad_entropy), at(g.saved_lse), at(g.saved_entropy), d.tile(), stream,
                     error_flags);
    if constexpr (!std::is_same_v<T, A>)
      cd::narrow_copy<T, A><<<cd::grid_for(n * V), 256, 0, stream>>>(d.tile(), d.dx_t(), n * V);
    ::reco::detail::cuda_check(cudaGetLastError(), "linear_logp_entropy kernels");
    const T* dx = d.dx_t();
    if (g.dhidden || g.dhidden_accum) {
      A* dst = g.dhidden_accum ? g.dhidden_accum + first * dhs : d.dhc();
      cd::gemm<T, A>(handle, false, !d.w_row_major, n, H, V, dx, V, in.weight, d.w_ld, A(0), dst,
                     g.dhidden_accum ? dhs : H);
      if (g.dhidden) {
        cd::write_dh<T, A><<<cd::grid_for(n * H), 256, 0, stream>>>(d.dhc(), first, n, H, in.row_mask, g.dhidden, dhs);
        ::reco::detail::cuda_check(cudaGetLastError(), "linear_logp_entropy kernels");
      }
    }
    if (g.dweight) cd::gemm<T, A>(handle, true, false, V, H, n, dx, V, d.hc(), H, A(1), g.dweight, dws);
    if (g.dbias) cd::gemm<T, A>(handle, true, false, V, 1, n, dx, V, d.ones(), 1, A(1), g.dbias, 1);
  }
}

}  // namespace logits
RECO_NAMESPACE_END
