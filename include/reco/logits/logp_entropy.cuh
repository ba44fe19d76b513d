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
// there is no N×V temporary, no allocation and no host synchronisation. The per-thread row work
// is written as host-device functions, so the tests replay it on the host without a GPU.
//
// Errors. Sizes, the temperature and missing pointers are checked on the host (reco::error, as
// on the CPU). What lives in device memory cannot be checked without a synchronisation, so the
// kernels mark it instead: an out-of-range token of an unmasked row makes that row's logp (and
// its dlogits row) NaN, an unmasked row of all -inf logits, with a +inf logit or whose largest
// logit / temperature overflows makes its outputs NaN, and each sets a bit in *error_flags when
// that device int is given (reco::logits::error_flag). Copy it to the
// host whenever convenient and pass it to throw_if_error_flags().
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "reco/config.hpp"
#include "reco/detail/cuda_check.cuh"
#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

// #pragma unroll for the device pass of host-device functions (the host compiler would warn).
#if defined(__CUDA_ARCH__)
#define RECO_LOGITS_UNROLL _Pragma("unroll")
#else
#define RECO_LOGITS_UNROLL
#endif

RECO_NAMESPACE_BEGIN
namespace logits {
namespace cuda_detail {

// Everything a thread does to one row is a host-device function: the kernels below only add the
// row loop, the block reduction and the writes.

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

// std::numeric_limits is host-only in device code without --expt-relaxed-constexpr.
RECO_HOST_DEVICE inline float lowest_value(float) { return -FLT_MAX; }
RECO_HOST_DEVICE inline double lowest_value(double) { return -DBL_MAX; }
RECO_HOST_DEVICE inline float highest_value(float) { return FLT_MAX; }
RECO_HOST_DEVICE inline double highest_value(double) { return DBL_MAX; }
RECO_HOST_DEVICE inline float nan_value(float) {
#if RECO_IN_DEVICE_CODE
  return __int_as_float(0x7fc00000);
#else
  return std::numeric_limits<float>::quiet_NaN();
#endif
}
RECO_HOST_DEVICE inline double nan_value(double) {
#if RECO_IN_DEVICE_CODE
  return __longlong_as_double(0x7ff8000000000000LL);
#else
  return std::numeric_limits<double>::quiet_NaN();
#endif
}
RECO_HOST_DEVICE inline float exp2_of(float x) {
#if RECO_IN_DEVICE_CODE
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}
RECO_HOST_DEVICE inline double exp2_of(double x) {
#if RECO_IN_DEVICE_CODE
  return exp2(x);
#else
  return std::exp2(x);
#endif
}
RECO_HOST_DEVICE inline float log_of(float x) {
#if RECO_IN_DEVICE_CODE
  return logf(x);
#else
  return std::log(x);
#endif
}
RECO_HOST_DEVICE inline double log_of(double x) {
#if RECO_IN_DEVICE_CODE
  return log(x);
#else
  return std::log(x);
#endif
}
// Streaming (evict-first) 16-byte accesses: every logit is touched once per pass.
RECO_HOST_DEVICE inline uint4 load_streaming(const uint4* p) {
#if RECO_IN_DEVICE_CODE
  return __ldcs(p);
#else
  return *p;
#endif
}
RECO_HOST_DEVICE inline void store_streaming(uint4* p, const uint4& v) {
#if RECO_IN_DEVICE_CODE
  __stcs(p, v);
#else
  *p = v;
#endif
}

// Ternary clamps keep NaN (a NaN logit must reach the row's outputs).
template <class A>
RECO_HOST_DEVICE inline A clamp_floor(A t) {
  return t < device_floor<A>::value ? device_floor<A>::value : t;
}
template <class A>
RECO_HOST_DEVICE inline A clamp_nonpositive(A t) {
  return t > A(0) ? A(0) : t;
}

// One thread's (or a merged group's) share of a row, relative to its own maximum m (logit
// units): s = Σ 2^d, u = Σ 2^d·d, w = Σ 2^{2d}, d = (x - m)·log2(e)/τ.
template <class A>
struct online_sums {
  A m, s, u, w;
};

template <class A>
RECO_HOST_DEVICE inline online_sums<A> empty_sums() {
  // The lowest finite value rather than -inf, so that (x - m) is -inf, not NaN, for -inf logits.
  return {lowest_value(A{}), A(0), A(0), A(0)};
}

// Moves sums to a larger maximum m_new: 2^{d'} = c·2^d with c = 2^delta, d' = d + delta.
template <class A>
RECO_HOST_DEVICE inline void rescale(online_sums<A>& a, A m_new, A k) {
  const A delta = clamp_floor((a.m - m_new) * k);
  const A c = exp2_of(delta);
  a.u = c * (a.u + delta * a.s);
  a.s *= c;
  a.w *= c * c;
  a.m = m_new;
}

template <class A>
struct merge_sums {
  A k;
  RECO_HOST_DEVICE online_sums<A> operator()(online_sums<A> a, online_sums<A> b) const {
    const A m = a.m > b.m ? a.m : b.m;
    rescale(a, m, k);
    rescale(b, m, k);
    return {m, a.s + b.s, a.u + b.u, a.w + b.w};
  }
};

// Elements per 16-byte vector and the unpacking of one vector.
template <class T>
inline constexpr int vec_width = 16 / static_cast<int>(sizeof(T));

// 16-bit types go through 32-bit words with shifts (a T[8] array would live in local memory).
template <class T>
RECO_HOST_DEVICE inline void unpack(const uint4& raw, accum_t<T> (&v)[vec_width<T>]) {
  if constexpr (sizeof(T) == 2) {
    const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
RECO_LOGITS_UNROLL
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = static_cast<float>(T::from_bits(static_cast<std::uint16_t>(w[i] & 0xffffu)));
      v[2 * i + 1] = static_cast<float>(T::from_bits(static_cast<std::uint16_t>(w[i] >> 16)));
    }
  } else {
    memcpy(v, &raw, sizeof raw);  // float or double: the storage type is the arithmetic type
  }
}
template <class T>
RECO_HOST_DEVICE inline uint4 pack(const accum_t<T> (&v)[vec_width<T>]) {
  uint4 raw;
  if constexpr (sizeof(T) == 2) {
    std::uint32_t w[4];
RECO_LOGITS_UNROLL
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<std::uint32_t>(T(v[2 * i]).bits) | (static_cast<std::uint32_t>(T(v[2 * i + 1]).bits) << 16);
    raw = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    memcpy(&raw, v, sizeof raw);
  }
  return raw;
}

// A row split at 16-byte boundaries: scalar head, 16-byte vectors, scalar tail.
template <class T>
struct row_split {
  int head, vectors, tail;  // tail = first element after the vectors
  RECO_HOST_DEVICE row_split(const void* row, int vocab) {
    const int misalign = static_cast<int>(reinterpret_cast<std::uintptr_t>(row) & 15u);
    head = ((16 - misalign) & 15) / static_cast<int>(sizeof(T));  // T-aligned pointers only
    if (head > vocab) head = vocab;
    vectors = (vocab - head) / vec_width<T>;
    tail = head + vectors * vec_width<T>;
  }
};

template <class A, bool with_sq>
RECO_HOST_DEVICE inline void add_one(online_sums<A>& st, A x, A k) {
  if (x > st.m) rescale(st, x, k);
  const A d = clamp_floor((x - st.m) * k);
  const A e = exp2_of(d);
  st.s += e;
  st.u += e * d;
  if (with_sq) st.w += e * e;
}

// Adds one 16-byte vector: at most one rescale, then one exp2 per element.
template <class A, int N, bool with_sq>
RECO_HOST_DEVICE inline void add_vector(online_sums<A>& st, const A (&v)[N], A k) {
  A vmax = v[0];
RECO_LOGITS_UNROLL
  for (int i = 1; i < N; ++i) vmax = v[i] > vmax ? v[i] : vmax;
  if (vmax > st.m) rescale(st, vmax, k);
RECO_LOGITS_UNROLL
  for (int i = 0; i < N; ++i) {
    // (x - m)·k, not x·k - m·k: m may still be the lowest float, and m·k would overflow to -inf.
    const A d = clamp_floor((v[i] - st.m) * k);
    const A e = exp2_of(d);
    st.s += e;
    st.u += e * d;
    if (with_sq) st.w += e * e;
  }
}

// The forward share of thread `lane` of a group of `threads` working on row x.
template <class T, int threads, bool with_sq>
RECO_HOST_DEVICE online_sums<accum_t<T>> thread_row_sums(const T* x, int vocab, int lane, accum_t<T> k) {
  using A = accum_t<T>;
  constexpr int N = vec_width<T>;
  online_sums<A> st = empty_sums<A>();
  const row_split<T> split(x, vocab);
  for (int j = lane; j < split.head; j += threads) add_one<A, with_sq>(st, static_cast<A>(x[j]), k);
  const uint4* xv = reinterpret_cast<const uint4*>(x + split.head);
  int i = lane;
  for (; i + threads < split.vectors; i += 2 * threads) {  // two loads in flight
    const uint4 r0 = load_streaming(xv + i), r1 = load_streaming(xv + i + threads);
    A v0[N], v1[N];
    unpack<T>(r0, v0);
    unpack<T>(r1, v1);
    add_vector<A, N, with_sq>(st, v0, k);
    add_vector<A, N, with_sq>(st, v1, k);
  }
  if (i < split.vectors) {
    A v0[N];
    unpack<T>(load_streaming(xv + i), v0);
    add_vector<A, N, with_sq>(st, v0, k);
  }
  for (int j = split.tail + lane; j < vocab; j += threads) add_one<A, with_sq>(st, static_cast<A>(x[j]), k);
  return st;
}

template <class A>
struct row_outputs {
  A logp, entropy, lse, sum_p_squared;
  bool all_neg_inf;
  int error;  // 0, or the error_flag of a row without a distribution (its outputs are NaN)
};

// The row's outputs from its merged sums and the token's logit.
template <class A>
RECO_HOST_DEVICE row_outputs<A> finish_row(const online_sums<A>& total, A x_y, bool token_ok, A inv_tau) {
  const A nan = nan_value(A{});
  // The maximum of a row with a +inf logit is +inf (NaN logits never become the maximum).
  if (total.m > highest_value(A{})) return {nan, nan, nan, nan, false, error_row_pos_inf};
  if (total.s == A(0)) return {nan, nan, nan, nan, true, error_row_all_neg_inf};  // every logit -inf
  const A log_s = log_of(total.s);
  const A h = log_s - A(detail::ln_2) * total.u / total.s;
  const A lse = total.m * inv_tau + log_s;
  if (lse > highest_value(A{}) || lse < lowest_value(A{}))  // finite logits, z = x / τ out of range
    return {nan, nan, nan, nan, false, error_row_overflow};
  return {token_ok ? (x_y - total.m) * inv_tau - log_s : nan, h < A(0) ? A(0) : h, lse,
          total.w / (total.s * total.s), false, 0};
}

// dlogits_j = p_j (c0 + c1 t_j) + [j = y] g/τ with t_j = log2 p_j (see the host version).
template <class A>
struct row_gradient {
  A k, lse_x, c0, c1, g_y;  // lse_x = τ·LSE, in logit units
  int y;
  RECO_HOST_DEVICE A operator()(A x, int j) const {
    const A t = clamp_nonpositive(clamp_floor((x - lse_x) * k));
    const A d = exp2_of(t) * (c0 + c1 * t);
    return j == y ? d + g_y : d;
  }
};

// Thread `lane`'s share of one dlogits row. `vector_ok`: x and dx have the same alignment modulo
// 16 bytes, so they split alike. In place, each vector is read and then written by one thread.
template <class T, int threads>
RECO_HOST_DEVICE void thread_row_gradient(const T* x, T* dx, int vocab, int lane, bool vector_ok,
                                          const row_gradient<accum_t<T>>& grad) {
  using A = accum_t<T>;
  constexpr int N = vec_width<T>;
  if (!vector_ok) {
    for (int j = lane; j < vocab; j += threads) dx[j] = T(grad(static_cast<A>(x[j]), j));
    return;
  }
  const row_split<T> split(dx, vocab);
  for (int j = lane; j < split.head; j += threads) dx[j] = T(grad(static_cast<A>(x[j]), j));
  const uint4* xv = reinterpret_cast<const uint4*>(x + split.head);
  uint4* dxv = reinterpret_cast<uint4*>(dx + split.head);
  int v = lane;
  for (; v + threads < split.vectors; v += 2 * threads) {
    const uint4 r0 = load_streaming(xv + v), r1 = load_streaming(xv + v + threads);
    A a0[N], a1[N];
    unpack<T>(r0, a0);
    unpack<T>(r1, a1);
    const int j0 = split.head + v * N, j1 = split.head + (v + threads) * N;
RECO_LOGITS_UNROLL
    for (int e = 0; e < N; ++e) {
      a0[e] = grad(a0[e], j0 + e);
      a1[e] = grad(a1[e], j1 + e);
    }
    store_streaming(dxv + v, pack<T>(a0));
    store_streaming(dxv + v + threads, pack<T>(a1));
  }
  if (v < split.vectors) {
    A a0[N];
    unpack<T>(load_streaming(xv + v), a0);
    const int j0 = split.head + v * N;
RECO_LOGITS_UNROLL
    for (int e = 0; e < N; ++e) a0[e] = grad(a0[e], j0 + e);
    store_streaming(dxv + v, pack<T>(a0));
  }
  for (int j = split.tail + lane; j < vocab; j += threads) dx[j] = T(grad(static_cast<A>(x[j]), j));
}

// Thread `lane`'s share of filling a dlogits row with one value (0 for masked rows).
template <class T, int threads>
RECO_HOST_DEVICE void thread_row_fill(T* dx, int vocab, int lane, accum_t<T> value) {
  using A = accum_t<T>;
  constexpr int N = vec_width<T>;
  A f[N];
RECO_LOGITS_UNROLL
  for (int e = 0; e < N; ++e) f[e] = value;
  const uint4 raw = pack<T>(f);
  const row_split<T> split(dx, vocab);
  uint4* dxv = reinterpret_cast<uint4*>(dx + split.head);
  for (int j = lane; j < split.head; j += threads) dx[j] = T(value);
  for (int v = lane; v < split.vectors; v += threads) store_streaming(dxv + v, raw);
  for (int j = split.tail + lane; j < vocab; j += threads) dx[j] = T(value);
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

// Forward: a group of `threads` threads per row (a warp, or the whole block).
template <class T, int threads, int block, bool with_sq>
__global__ void __launch_bounds__(block) forward_kernel(forward_params<T> p) {
  using A = accum_t<T>;
  constexpr int rows_per_block = block / threads;
  using block_reduce = cub::BlockReduce<online_sums<A>, block>;
  using warp_reduce = cub::WarpReduce<online_sums<A>, threads == block ? 32 : threads>;
  __shared__ union reduce_storage {
    typename block_reduce::TempStorage whole_block;
    typename warp_reduce::TempStorage per_warp[rows_per_block];
  } temp;

  const int group = static_cast<int>(threadIdx.x) / threads;
  const int lane = static_cast<int>(threadIdx.x) % threads;
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
    // The token's logit is fetched before the row so that its latency hides behind it.
    std::int64_t y = 0;
    A x_y = A(0);
    if (p.logp) {
      y = p.tokens[row];
      if (lane == 0 && y >= 0 && y < p.vocab) x_y = static_cast<A>(x[y]);
    }
    const online_sums<A> mine = thread_row_sums<T, threads, with_sq>(x, p.vocab, lane, p.k);

    online_sums<A> total;
    if constexpr (threads == block) {
      total = block_reduce(temp.whole_block).Reduce(mine, merge);
      __syncthreads();  // temp is reused by the next row
    } else {
      total = warp_reduce(temp.per_warp[group]).Reduce(mine, merge);
      __syncwarp();
    }

    if (lane == 0) {
      const bool token_ok = !p.logp || (y >= 0 && y < p.vocab);
      const row_outputs<A> out = finish_row(total, x_y, token_ok, p.inv_tau);
      if (p.error_flags && !token_ok) atomicOr(p.error_flags, error_token_out_of_range);
      if (p.error_flags && out.error) atomicOr(p.error_flags, out.error);
      if (p.logp) p.logp[row] = out.logp;
      if (p.entropy) p.entropy[row] = out.entropy;
      if (p.lse) p.lse[row] = out.lse;
      if (p.sum_p_squared) p.sum_p_squared[row] = out.sum_p_squared;
    }
  }
}

template <class T, int threads, int block>
__global__ void __launch_bounds__(block) backward_kernel(backward_params<T> p) {
  using A = accum_t<T>;
  constexpr int rows_per_block = block / threads;
  const int group = static_cast<int>(threadIdx.x) / threads;
  const int lane = static_cast<int>(threadIdx.x) % threads;

  for (index_t row = static_cast<index_t>(blockIdx.x) * rows_per_block + group; row < p.rows;
       row += static_cast<index_t>(gridDim.x) * rows_per_block) {
    const T* x = p.logits + row * p.row_stride;
    T* dx = p.dlogits + row * p.row_stride;
    const bool masked = p.row_mask && !p.row_mask[row];
    if (masked) {
      thread_row_fill<T, threads>(dx, p.vocab, lane, A(0));  // exactly +0
      continue;
    }
    const std::int64_t y = p.grad_logp ? p.tokens[row] : std::int64_t(-1);
    if (p.grad_logp && (y < 0 || y >= p.vocab)) {  // no right answer: NaN, and say so
      if (lane == 0 && p.error_flags) atomicOr(p.error_flags, error_token_out_of_range);
      thread_row_fill<T, threads>(dx, p.vocab, lane, nan_value(A{}));
      continue;
    }
    const A g = p.grad_logp ? p.grad_logp[row] : A(0);
    const A g_h = p.grad_entropy ? p.grad_entropy[row] : A(0);
    const A h = p.grad_entropy ? p.entropy[row] : A(0);
    const row_gradient<A> grad{p.k,       p.lse[row] * p.tau,      -(g + g_h * h) * p.inv_tau,
                               -g_h * p.ln2_over_tau, g * p.inv_tau, static_cast<int>(y)};
    thread_row_gradient<T, threads>(x, dx, p.vocab, lane, p.vector_ok, grad);
  }
}

using ::reco::detail::cuda_check;

// Persistent-style grid: as many blocks as fit on the device at once (no more than there are row
// groups); the grid-stride loop covers the rest.
template <class Kernel>
unsigned grid_for(Kernel kernel, int block, index_t groups) {
  int device = 0, sms = 0, per_sm = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0), "occupancy");
  const index_t resident = static_cast<index_t>(sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(groups < resident ? groups : resident);
}

// Threads per row: a warp for short rows (eight rows per 256-thread block), a whole block of 256
// or 512 otherwise.
inline int threads_per_row(index_t vocab) { return vocab <= 1024 ? 32 : (vocab <= 16384 ? 256 : 512); }

template <class T, int threads, int block, bool with_sq>
void launch_forward(const forward_params<T>& p, cudaStream_t stream) {
  auto kernel = forward_kernel<T, threads, block, with_sq>;
  const index_t groups = (p.rows + block / threads - 1) / (block / threads);
  kernel<<<grid_for(kernel, block, groups), block, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "forward kernel launch");
}

template <class T, int threads, int block>
void launch_backward(const backward_params<T>& p, cudaStream_t stream) {
  auto kernel = backward_kernel<T, threads, block>;
  const index_t groups = (p.rows + block / threads - 1) / (block / threads);
  kernel<<<grid_for(kernel, block, groups), block, 0, stream>>>(p);
  cuda_check(cudaGetLastError(), "backward kernel launch");
}

template <class T, bool with_sq>
void dispatch_forward(const forward_params<T>& p, cudaStream_t stream) {
  switch (threads_per_row(p.vocab)) {
    case 32: launch_forward<T, 32, 256, with_sq>(p, stream); break;
    case 256: launch_forward<T, 256, 256, with_sq>(p, stream); break;
    default: launch_forward<T, 512, 512, with_sq>(p, stream); break;
  }
}

template <class T>
void dispatch_backward(const backward_params<T>& p, cudaStream_t stream) {
  switch (threads_per_row(p.vocab)) {
    case 32: launch_backward<T, 32, 256>(p, stream); break;
    case 256: launch_backward<T, 256, 256>(p, stream); break;
    default: launch_backward<T, 512, 512>(p, stream); break;
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
  detail::check_temperature_range<A>(temperature);
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
  detail::check_temperature_range<A>(temperature);
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
  cuda_detail::dispatch_backward(p, stream);
}

}  // namespace logits
RECO_NAMESPACE_END
