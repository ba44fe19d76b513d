// CUDA kernels for reco/logits/logp_entropy.hpp: the same math and the same arguments, on device
// pointers and a stream. Requires nvcc.
//
//   namespace rl = reco::logits;
//   // d_logits: [rows, vocab] bf16 on the device; d_tokens int64; outputs float, all device memory
//   rl::forward_cuda(d_logits, rows, vocab, vocab, d_tokens, 0.7, d_mask, d_logp, d_entropy, d_lse, stream);
//   ... the loss writes d_grad_logp, d_grad_entropy ...
//   rl::backward_cuda(d_logits, rows, vocab, vocab, d_tokens, 0.7, d_mask, d_grad_logp, d_grad_entropy,
//                     d_lse, d_entropy, /*dlogits=*/d_logits, stream);   // in place
//
// Forward reads each row once: one block per row for large vocabularies (one warp per row for
// V <= 1024), each thread keeping an online (max, Σ2^d, Σ2^d·d, Σ2^{2d}) over 16-byte vector loads,
// merged with cub::BlockReduce / cub::WarpReduce. Backward reads each row once and writes it once,
// vectorised the same way. Rows are walked by a grid-stride loop over blockIdx.x (so any row
// count works; gridDim.y/z are never used), accumulation is fp32 (fp64 for double logits), and
// there is no N×V temporary, no allocation and no host synchronisation.
//
// Errors. Sizes, the temperature and missing pointers are checked on the host (reco::error, as
// on the CPU). What lives in device memory cannot be checked without a synchronisation, so the
// kernels mark it instead: an out-of-range token of an unmasked row makes that row's logp (and
// its dlogits row) NaN, an unmasked row of all -inf logits makes its outputs NaN, and either sets
// a bit in *error_flags when that device int is given (reco::logits::error_flag). Copy it to the
// host whenever convenient and pass it to throw_if_error_flags().
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "reco/config.hpp"
#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace logits {
namespace cuda_detail {

// Clamp floor of the base-2 exponent: 2^floor is exactly 0 in A even without flush-to-zero
// (float denormals end at 2^-149), so a -inf logit contributes 0·floor = 0.
template <class A>
struct device_floor;
template <>
struct device_floor<float> {
  static constexpr float value = -256.0f;
};
template <>
struct device_floor<double> {
  static constexpr double value = -2048.0;
};

// std::numeric_limits is host-only without --expt-relaxed-constexpr.
__device__ inline float lowest_dev(float) { return -FLT_MAX; }
__device__ inline double lowest_dev(double) { return -DBL_MAX; }
__device__ inline float nan_dev(float) { return __int_as_float(0x7fc00000); }
__device__ inline double nan_dev(double) { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ inline float exp2_dev(float x) { return exp2f(x); }
__device__ inline double exp2_dev(double x) { return exp2(x); }
__device__ inline float log_dev(float x) { return logf(x); }
__device__ inline double log_dev(double x) { return log(x); }

// Ternary clamps keep NaN (a NaN logit must reach the row's outputs).
template <class A>
__device__ inline A clamp_floor(A t) {
  return t < device_floor<A>::value ? device_floor<A>::value : t;
}
template <class A>
__device__ inline A clamp_nonpositive(A t) {
  return t > A(0) ? A(0) : t;
}

// One thread's (or a merged group's) share of a row, relative to its own maximum m (logit
// units): s = Σ 2^d, u = Σ 2^d·d, w = Σ 2^{2d}, d = (x - m)·log2(e)/τ.
template <class A>
struct online_sums {
  A m, s, u, w;
};

template <class A>
__device__ inline online_sums<A> empty_sums() {
  // The lowest finite value rather than -inf, so that (x - m) is -inf, not NaN, for -inf logits.
  return {lowest_dev(A{}), A(0), A(0), A(0)};
}

// Moves sums to a larger maximum m_new: 2^{d'} = c·2^d with c = 2^delta, d' = d + delta.
template <class A>
__device__ inline void rescale(online_sums<A>& a, A m_new, A k) {
  const A delta = clamp_floor((a.m - m_new) * k);
  const A c = exp2_dev(delta);
  a.u = c * (a.u + delta * a.s);
  a.s *= c;
  a.w *= c * c;
  a.m = m_new;
}

template <class A>
struct merge_sums {
  A k;
  __device__ online_sums<A> operator()(online_sums<A> a, online_sums<A> b) const {
    const A m = a.m > b.m ? a.m : b.m;
    rescale(a, m, k);
    rescale(b, m, k);
    return {m, a.s + b.s, a.u + b.u, a.w + b.w};
  }
};

// Elements per 16-byte vector and the unpacking of one vector.
template <class T>
inline constexpr int vec_width = 16 / static_cast<int>(sizeof(T));

template <class T>
__device__ inline void unpack(const uint4& raw, accum_t<T> (&v)[vec_width<T>]) {
  T e[vec_width<T>];
  memcpy(e, &raw, sizeof raw);
#pragma unroll
  for (int i = 0; i < vec_width<T>; ++i) v[i] = static_cast<accum_t<T>>(e[i]);
}
template <class T>
__device__ inline uint4 pack(const accum_t<T> (&v)[vec_width<T>]) {
  T e[vec_width<T>];
#pragma unroll
  for (int i = 0; i < vec_width<T>; ++i) e[i] = T(v[i]);
  uint4 raw;
  memcpy(&raw, e, sizeof raw);
  return raw;
}

// Elements of a row before its first 16-byte boundary (T-aligned pointers only).
template <class T>
__device__ inline int head_elements(const void* row, int vocab) {
  const int misalign = static_cast<int>(reinterpret_cast<std::uintptr_t>(row) & 15u);
  const int head = ((16 - misalign) & 15) / static_cast<int>(sizeof(T));
  return head < vocab ? head : vocab;
}

template <class T>
struct forward_params {
  const T* logits;
  index_t rows, row_stride;
  int vocab;
  const std::int64_t* tokens;
  const std::uint8_t* row_mask;
  accum_t<T> inv_tau, k;  // 1/τ and log2(e)/τ
  accum_t<T>*logp, *entropy, *lse, *sum_p_squared;
  int* error_flags;
};

template <class T>
struct backward_params {
  const T* logits;
  T* dlogits;
  index_t rows, row_stride;
  int vocab;
  bool vector_ok;  // logits and dlogits share their alignment modulo 16 bytes
  const std::int64_t* tokens;
  const std::uint8_t* row_mask;
  const accum_t<T>*grad_logp, *grad_entropy, *lse, *entropy;
  accum_t<T> tau, inv_tau, k, ln2_over_tau;
  int* error_flags;
};

template <class A, bool with_sq>
__device__ inline void add_one(online_sums<A>& st, A x, A k) {  // head/tail elements
  if (x > st.m) rescale(st, x, k);
  const A d = clamp_floor((x - st.m) * k);
  const A e = exp2_dev(d);
  st.s += e;
  st.u += e * d;
  if (with_sq) st.w += e * e;
}

// Adds one 16-byte vector: at most one rescale, then one exp2 per element.
template <class A, int N, bool with_sq>
__device__ inline void add_vector(online_sums<A>& st, const A (&v)[N], A k) {
  A vmax = v[0];
#pragma unroll
  for (int i = 1; i < N; ++i) vmax = v[i] > vmax ? v[i] : vmax;
  if (vmax > st.m) rescale(st, vmax, k);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    // (x - m)·k, not x·k - m·k: m may still be the lowest float, and m·k would overflow to -inf.
    const A d = clamp_floor((v[i] - st.m) * k);
    const A e = exp2_dev(d);
    st.s += e;
    st.u += e * d;
    if (with_sq) st.w += e * e;
  }
}

template <class T, int THREADS, int BLOCK, bool with_sq>
__global__ void __launch_bounds__(BLOCK) forward_kernel(forward_params<T> p) {
  using A = accum_t<T>;
  constexpr int N = vec_width<T>;
  constexpr int rows_per_block = BLOCK / THREADS;
  using block_reduce = cub::BlockReduce<online_sums<A>, BLOCK>;
  using warp_reduce = cub::WarpReduce<online_sums<A>, THREADS == BLOCK ? 32 : THREADS>;
  __shared__ union reduce_storage {
    typename block_reduce::TempStorage block;
    typename warp_reduce::TempStorage warp[rows_per_block];
  } temp;

  const int group = static_cast<int>(threadIdx.x) / THREADS;
  const int lane = static_cast<int>(threadIdx.x) % THREADS;
  const int vocab = p.vocab;
  const merge_sums<A> merge{p.k};

  for (index_t row = static_cast<index_t>(blockIdx.x) * rows_per_block + group; row < p.rows;
       row += static_cast<index_t>(gridDim.x) * rows_per_block) {
    if (p.row_mask && !p.row_mask[row]) {  // the same for every thread of the group
      if (lane == 0) {
        if (p.logp) p.logp[row] = A(0);
        if (p.entropy) p.entropy[row] = A(0);
        if (p.lse) p.lse[row] = A(0);
        if (p.sum_p_squared) p.sum_p_squared[row] = A(0);
      }
      continue;
    }
    const T* x = p.logits + row * p.row_stride;
    // The token's logit is fetched up front so that its latency hides behind the row.
    std::int64_t y = 0;
    A x_y = A(0);
    if (p.logp) {
      y = p.tokens[row];
      if (lane == 0 && y >= 0 && y < vocab) x_y = static_cast<A>(x[y]);
    }

    online_sums<A> st = empty_sums<A>();
    const int head = head_elements<T>(x, vocab);
    const int vectors = (vocab - head) / N;
    const int tail = head + vectors * N;
    for (int j = lane; j < head; j += THREADS) add_one<A, with_sq>(st, static_cast<A>(x[j]), p.k);
    const uint4* xv = reinterpret_cast<const uint4*>(x + head);
    int i = lane;
    // Two loads in flight per thread before either is consumed.
    for (; i + THREADS < vectors; i += 2 * THREADS) {
      const uint4 r0 = __ldcs(xv + i), r1 = __ldcs(xv + i + THREADS);
      A v0[N], v1[N];
      unpack<T>(r0, v0);
      unpack<T>(r1, v1);
      add_vector<A, N, with_sq>(st, v0, p.k);
      add_vector<A, N, with_sq>(st, v1, p.k);
    }
    if (i < vectors) {
      A v0[N];
      unpack<T>(__ldcs(xv + i), v0);
      add_vector<A, N, with_sq>(st, v0, p.k);
    }
    for (int j = tail + lane; j < vocab; j += THREADS) add_one<A, with_sq>(st, static_cast<A>(x[j]), p.k);

    online_sums<A> total;
    if constexpr (THREADS == BLOCK) {
      total = block_reduce(temp.block).Reduce(st, merge);
      __syncthreads();  // temp is reused by the next row
    } else {
      total = warp_reduce(temp.warp[group]).Reduce(st, merge);
      __syncwarp();
    }

    if (lane == 0) {
      const A nan = nan_dev(A{});
      const bool token_ok = !p.logp || (y >= 0 && y < vocab);
      if (!token_ok && p.error_flags) atomicOr(p.error_flags, error_token_out_of_range);
      if (total.s == A(0)) {  // every logit -inf
        if (p.error_flags) atomicOr(p.error_flags, error_row_all_neg_inf);
        if (p.logp) p.logp[row] = nan;
        if (p.entropy) p.entropy[row] = nan;
        if (p.lse) p.lse[row] = nan;
        if (p.sum_p_squared) p.sum_p_squared[row] = nan;
      } else {
        const A log_s = log_dev(total.s);
        const A h = log_s - A(detail::ln_2) * total.u / total.s;
        if (p.lse) p.lse[row] = total.m * p.inv_tau + log_s;
        if (p.entropy) p.entropy[row] = h < A(0) ? A(0) : h;
        if (p.logp) p.logp[row] = token_ok ? (x_y - total.m) * p.inv_tau - log_s : nan;
        if (p.sum_p_squared) p.sum_p_squared[row] = total.w / (total.s * total.s);
      }
    }
  }
}

// dlogits_j = p_j (c0 + c1 t_j) + [j = y] g/τ with t_j = log2 p_j (see the host version).
template <class A>
struct row_gradient {
  A k, lse_x, c0, c1, g_y;  // lse_x = τ·LSE, in logit units
  int y;
  __device__ A operator()(A x, int j) const {
    const A t = clamp_nonpositive(clamp_floor((x - lse_x) * k));
    const A d = exp2_dev(t) * (c0 + c1 * t);
    return j == y ? d + g_y : d;
  }
};

template <class T, int THREADS, int BLOCK>
__global__ void __launch_bounds__(BLOCK) backward_kernel(backward_params<T> p) {
  using A = accum_t<T>;
  constexpr int N = vec_width<T>;
  constexpr int rows_per_block = BLOCK / THREADS;
  const int group = static_cast<int>(threadIdx.x) / THREADS;
  const int lane = static_cast<int>(threadIdx.x) % THREADS;
  const int vocab = p.vocab;

  for (index_t row = static_cast<index_t>(blockIdx.x) * rows_per_block + group; row < p.rows;
       row += static_cast<index_t>(gridDim.x) * rows_per_block) {
    const T* x = p.logits + row * p.row_stride;
    T* dx = p.dlogits + row * p.row_stride;
    const int head = head_elements<T>(dx, vocab);
    const int vectors = (vocab - head) / N;
    const int tail = head + vectors * N;
    uint4* dxv = reinterpret_cast<uint4*>(dx + head);

    const bool masked = p.row_mask && !p.row_mask[row];
    const std::int64_t y = (!masked && p.grad_logp) ? p.tokens[row] : std::int64_t(-1);
    const bool token_bad = p.grad_logp && !masked && (y < 0 || y >= vocab);
    if (masked || token_bad) {
      // Exactly 0 for a masked row; NaN for a row whose token cannot be right.
      if (token_bad && lane == 0 && p.error_flags) atomicOr(p.error_flags, error_token_out_of_range);
      const A fill = masked ? A(0) : nan_dev(A{});
      A f[N];
#pragma unroll
      for (int e = 0; e < N; ++e) f[e] = fill;
      const uint4 raw = pack<T>(f);
      for (int j = lane; j < head; j += THREADS) dx[j] = T(fill);
      for (int v = lane; v < vectors; v += THREADS) __stcs(dxv + v, raw);
      for (int j = tail + lane; j < vocab; j += THREADS) dx[j] = T(fill);
      continue;
    }

    const A g = p.grad_logp ? p.grad_logp[row] : A(0);
    const A g_h = p.grad_entropy ? p.grad_entropy[row] : A(0);
    const A h = p.grad_entropy ? p.entropy[row] : A(0);
    const row_gradient<A> grad{p.k, p.lse[row] * p.tau, -(g + g_h * h) * p.inv_tau, -g_h * p.ln2_over_tau,
                               g * p.inv_tau, static_cast<int>(y)};

    if (!p.vector_ok) {  // logits and dlogits misaligned relative to each other: scalar row
      for (int j = lane; j < vocab; j += THREADS) dx[j] = T(grad(static_cast<A>(x[j]), j));
      continue;
    }
    for (int j = lane; j < head; j += THREADS) dx[j] = T(grad(static_cast<A>(x[j]), j));
    const uint4* xv = reinterpret_cast<const uint4*>(x + head);
    // In place, every vector is read and then written by the same thread: no hazard.
    int v = lane;
    for (; v + THREADS < vectors; v += 2 * THREADS) {
      const uint4 r0 = __ldcs(xv + v), r1 = __ldcs(xv + v + THREADS);
      A a0[N], a1[N];
      unpack<T>(r0, a0);
      unpack<T>(r1, a1);
      const int j0 = head + v * N, j1 = head + (v + THREADS) * N;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        a0[e] = grad(a0[e], j0 + e);
        a1[e] = grad(a1[e], j1 + e);
      }
      __stcs(dxv + v, pack<T>(a0));
      __stcs(dxv + v + THREADS, pack<T>(a1));
    }
    if (v < vectors) {
      A a0[N];
      unpack<T>(__ldcs(xv + v), a0);
      const int j0 = head + v * N;
#pragma unroll
      for (int e = 0; e < N; ++e) a0[e] = grad(a0[e], j0 + e);
      __stcs(dxv + v, pack<T>(a0));
    }
    for (int j = tail + lane; j < vocab; j += THREADS) dx[j] = T(grad(static_cast<A>(x[j]), j));
  }
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("reco::logits: CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Persistent-style grid: as many blocks as fit on the device at once (no more than there are row
// groups); the grid-stride loop covers the rest.
template <class Kernel>
unsigned grid_for(Kernel kernel, int block, index_t groups) {
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0), "occupancy");
  const index_t resident = static_cast<index_t>(sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(groups < resident ? groups : resident);
}

// Threads per row: a warp for short rows (several rows per block), a whole block otherwise.
enum class row_shape { warp, block256, block512 };
inline row_shape shape_for(index_t vocab) {
  if (vocab <= 1024) return row_shape::warp;
  if (vocab <= 16384) return row_shape::block256;
  return row_shape::block512;
}

template <class T, int THREADS, int BLOCK, bool with_sq>
void launch_forward(const forward_params<T>& p, cudaStream_t stream) {
  auto kernel = forward_kernel<T, THREADS, BLOCK, with_sq>;
  const index_t groups = (p.rows + BLOCK / THREADS - 1) / (BLOCK / THREADS);
  kernel<<<grid_for(kernel, BLOCK, groups), BLOCK, 0, stream>>>(p);
  check(cudaGetLastError(), "forward kernel launch");
}

template <class T, int THREADS, int BLOCK>
void launch_backward(const backward_params<T>& p, cudaStream_t stream) {
  auto kernel = backward_kernel<T, THREADS, BLOCK>;
  const index_t groups = (p.rows + BLOCK / THREADS - 1) / (BLOCK / THREADS);
  kernel<<<grid_for(kernel, BLOCK, groups), BLOCK, 0, stream>>>(p);
  check(cudaGetLastError(), "backward kernel launch");
}

template <class T, bool with_sq>
void dispatch_forward(const forward_params<T>& p, cudaStream_t stream) {
  switch (shape_for(p.vocab)) {
    case row_shape::warp: launch_forward<T, 32, 256, with_sq>(p, stream); break;
    case row_shape::block256: launch_forward<T, 256, 256, with_sq>(p, stream); break;
    case row_shape::block512: launch_forward<T, 512, 512, with_sq>(p, stream); break;
  }
}

inline void check_vocab_fits(index_t vocab) {
  ::reco::detail::require(vocab <= INT_MAX, "vocab", "must be <= 2^31 - 1 on the device, got " + std::to_string(vocab));
}

}  // namespace cuda_detail

// Forward on the device; see forward() in logp_entropy.hpp for the arguments. All pointers are
// device pointers (error_flags: a device int the kernel ORs error_flag bits into, or null).
template <class T>
void forward_cuda(const T* logits, index_t rows, index_t vocab, index_t row_stride, const std::int64_t* tokens,
                  double temperature, const std::uint8_t* row_mask, accum_t<T>* logp, accum_t<T>* entropy,
                  accum_t<T>* lse, cudaStream_t stream, accum_t<T>* sum_p_squared = nullptr, int* error_flags = nullptr) {
  static_assert(is_logit_type_v<T>, "reco::logits: logits must be float, double, reco::bf16_t or reco::f16_t");
  using A = accum_t<T>;
  detail::check_problem(logits != nullptr, rows, vocab, row_stride, temperature);
  cuda_detail::check_vocab_fits(vocab);
  ::reco::detail::require(logp == nullptr || tokens != nullptr || rows == 0, "tokens", "is null but logp is requested");
  if (rows == 0) return;
  cuda_detail::forward_params<T> p{logits, rows, row_stride, static_cast<int>(vocab), tokens, row_mask,
                                   static_cast<A>(1.0 / temperature), static_cast<A>(detail::log2_e / temperature),
                                   logp, entropy, lse, sum_p_squared, error_flags};
  if (sum_p_squared) cuda_detail::dispatch_forward<T, true>(p, stream);
  else cuda_detail::dispatch_forward<T, false>(p, stream);
}

// Backward on the device; see backward() in logp_entropy.hpp. dlogits may be logits (in place).
template <class T>
void backward_cuda(const T* logits, index_t rows, index_t vocab, index_t row_stride, const std::int64_t* tokens,
                   double temperature, const std::uint8_t* row_mask, const accum_t<T>* grad_logp,
                   const accum_t<T>* grad_entropy, const accum_t<T>* lse, const accum_t<T>* entropy, T* dlogits,
                   cudaStream_t stream, int* error_flags = nullptr) {
  static_assert(is_logit_type_v<T>, "reco::logits: logits must be float, double, reco::bf16_t or reco::f16_t");
  using A = accum_t<T>;
  using ::reco::detail::require;
  detail::check_problem(logits != nullptr, rows, vocab, row_stride, temperature);
  cuda_detail::check_vocab_fits(vocab);
  require(dlogits != nullptr || rows == 0, "dlogits", "is null");
  require(lse != nullptr || rows == 0, "lse", "is null (pass the lse saved by forward)");
  require(grad_entropy == nullptr || entropy != nullptr, "entropy", "is null but grad_entropy is given");
  require(grad_logp == nullptr || tokens != nullptr || rows == 0, "tokens", "is null but grad_logp is given");
  if (rows == 0) return;
  const bool vector_ok =
      ((reinterpret_cast<std::uintptr_t>(logits) ^ reinterpret_cast<std::uintptr_t>(dlogits)) & 15u) == 0;
  cuda_detail::backward_params<T> p{logits, dlogits, rows, row_stride, static_cast<int>(vocab), vector_ok, tokens,
                                    row_mask, grad_logp, grad_entropy, lse, entropy, static_cast<A>(temperature),
                                    static_cast<A>(1.0 / temperature), static_cast<A>(detail::log2_e / temperature),
                                    static_cast<A>(detail::ln_2 / temperature), error_flags};
  switch (cuda_detail::shape_for(vocab)) {
    case cuda_detail::row_shape::warp: cuda_detail::launch_backward<T, 32, 256>(p, stream); break;
    case cuda_detail::row_shape::block256: cuda_detail::launch_backward<T, 256, 256>(p, stream); break;
    case cuda_detail::row_shape::block512: cuda_detail::launch_backward<T, 512, 512>(p, stream); break;
  }
}

}  // namespace logits
RECO_NAMESPACE_END
