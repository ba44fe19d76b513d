// Log-probability of the sampled token and entropy of the sampling distribution, from logits,
// with the backward into the logits (definitions: docs/logits.md). Host version: any C++17 compiler,
// rows in parallel with OpenMP when it is enabled. The CUDA kernels with the same semantics are in
// reco/logits/logp_entropy.cuh.
//
// For row r of logits x (vocab entries, row r starts at logits + r * row_stride), temperature τ
// and sampled token y = tokens[r]:
//   z = x / τ,  LSE = log Σ_j e^{z_j},  p_j = e^{z_j - LSE}
//   logp[r] = z_y - LSE,  entropy[r] = LSE - Σ_j p_j z_j = -Σ_j p_j log p_j,  lse[r] = LSE
//   sum_p_squared[r] = Σ_j p_j²            (optional; verl's optimal-token-baseline statistic)
// Backward, for upstream gradients g = grad_logp[r] and g_H = grad_entropy[r]:
//   dlogits_j = [g (δ_jy - p_j) - g_H p_j (log p_j + H)] / τ
// sum_p_squared is an output only (no gradient flows through it).
//
//   namespace rl = reco::logits;
//   // logits: [rows, vocab] bf16 (reinterpret_cast from at::BFloat16* / __nv_bfloat16*)
//   std::vector<float> logp(rows), entropy(rows), lse(rows);
//   rl::forward(logits, rows, vocab, /*row_stride=*/vocab, tokens, /*temperature=*/0.7,
//               /*row_mask=*/nullptr, logp.data(), entropy.data(), lse.data());
//   ... the loss gives grad_logp[r] = dL/dlogp[r] and grad_entropy[r] = dL/dentropy[r] ...
//   rl::backward(logits, rows, vocab, vocab, tokens, 0.7, nullptr, grad_logp.data(),
//                grad_entropy.data(), lse.data(), entropy.data(), dlogits);  // dlogits may == logits
//
// Types. The logits' storage type T is float, double, reco::bf16_t or reco::f16_t. Every per-row
// quantity (logp, entropy, lse, sum_p_squared, the upstream gradients) has type accum_t<T>:
// double for double logits, float otherwise, and all arithmetic runs in that type.
//
// Arguments.
//   row_stride   elements from one row's start to the next (>= vocab: rows are evenly spaced,
//                not necessarily contiguous); dlogits uses the same.
//   tokens       [rows] int64 ids in [0, vocab); needed when logp or grad_logp is given.
//   row_mask     [rows] (nullable): 0 = skip the row (padding). A skipped row's logits and token
//                are never read; its outputs are 0 and its dlogits row is exactly 0.
//   outputs      each of logp, entropy, lse, sum_p_squared may be null (not computed). backward
//                needs the lse of forward, and entropy as well when grad_entropy is given.
//   grad_logp, grad_entropy   nullable: null means zero upstream gradient.
//   dlogits      either exactly logits (in place: each row is read before it is overwritten) or
//                a buffer that does not overlap it.
// Errors (reco::error, naming the argument): bad sizes or temperature, including a temperature
// so small that 1/τ overflows the accumulation type ("temperature"); a token outside [0, vocab)
// in an unmasked row ("tokens", thrown before anything is written); an unmasked row with a +inf
// logit or whose logits are all -inf ("logits"), or whose largest logit / τ overflows
// ("temperature"): such a row's outputs are NaN, the others are complete, then it throws.
// Logits must be finite or -inf; -inf means probability 0 and contributes exactly 0 to the
// entropy and the gradients. NaN logits give NaN outputs for their row.
//
// Numerics. The forward reads each row once: it keeps the running maximum m, s = Σ e^{z-m} and
// u = Σ e^{z-m}(z-m) (and Σ e^{2(z-m)} for sum_p_squared), rescaling them when m grows, and ends
// with LSE = m + log s, H = log s - u/s. Exponentials are base 2 on the pre-scaled argument
// (z - m) log2(e). The backward reads each row once and writes it once, recomputing
// p_j = e^{z_j - LSE} from the saved LSE. No N×V temporary; one 4 KiB stack buffer per thread.
// Results do not depend on the thread count (each row is reduced by one thread, in a fixed order).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "reco/config.hpp"
#include "reco/logits/half_types.hpp"

// The per-row loops are compiled three times (AVX-512, AVX2+FMA, baseline) and the best one for
// the running CPU is picked at load time, as ATen does for its kernels: the library is header-only,
// and most builds do not pass -march. GCC >= 11 on x86-64 Linux (ifunc); elsewhere, or with
// RECO_NO_TARGET_CLONES defined, the loops are compiled once for the flags in use.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__linux__) && \
    !defined(__CUDACC__) && !defined(RECO_NO_TARGET_CLONES)
#define RECO_LOGITS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RECO_LOGITS_CPU_CLONES
#endif

RECO_NAMESPACE_BEGIN
namespace logits {

template <class T>
struct accumulator {
  using type = float;
};
template <>
struct accumulator<double> {
  using type = double;
};
// The arithmetic and per-row type for logits stored as T.
template <class T>
using accum_t = typename accumulator<T>::type;

template <class T>
inline constexpr bool is_logit_type_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                        std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

// Bits the CUDA kernels set in their optional device error word (they cannot throw).
enum error_flag : int {
  error_token_out_of_range = 1,  // an unmasked row's token is outside [0, vocab)
  error_row_all_neg_inf = 2,     // an unmasked row's logits are all -inf
  error_row_pos_inf = 4,         // an unmasked row has a +inf logit
  error_row_overflow = 8,        // an unmasked row's largest logit / temperature overflows
};

// Turns a device error word, once copied to the host, into the exception the host path throws.
inline void throw_if_error_flags(int flags) {
  if (flags & error_token_out_of_range)
    ::reco::detail::fail("tokens", "a token id of an unmasked row is outside [0, vocab)");
  if (flags & error_row_pos_inf)
    ::reco::detail::fail("logits", "an unmasked row has a +inf logit (the distribution is undefined)");
  if (flags & error_row_all_neg_inf)
    ::reco::detail::fail("logits", "an unmasked row has every logit -inf (the distribution is undefined)");
  if (flags & error_row_overflow)
    ::reco::detail::fail("temperature",
                         "logits / temperature overflow the accumulation type in an unmasked row (the "
                         "temperature is too small for the size of the logits)");
}

namespace detail {

inline constexpr double log2_e = 1.4426950408889634;
inline constexpr double ln_2 = 0.6931471805599453;

// Arguments of the base-2 exponential are clamped from below to this floor: 2^floor is exactly 0
// in A, so an entry of probability 0 (a -inf logit) contributes 0 * floor = 0 rather than
// 0 * (-inf) = NaN.
template <class A>
struct exponent_floor;
template <>
struct exponent_floor<float> {
  static constexpr float value = -127.0f;
  static constexpr std::uint32_t bits = 0xc2fe0000u;  // the bit pattern of -127.0f
};
template <>
struct exponent_floor<double> {
  static constexpr double value = -2048.0;
};

// Lanes of independent partial sums (one 64-byte vector) and the number of logits widened into
// a stack buffer at a time (4 KiB, stays in L1 between the passes over it).
template <class A>
inline constexpr int lanes = 64 / static_cast<int>(sizeof(A));
template <class A>
inline constexpr int chunk = 4096 / static_cast<int>(sizeof(A));

// The float clamps work on the bit patterns. A float ternary against a constant is turned into a
// branch by GCC (partial redundancy elimination evaluates the rest of the loop body on the clamped
// path, and -ftrapping-math then forbids if-conversion), which stops the loop from vectorising;
// integer minima stay branch-free.
//   max(t, -127): as unsigned integers, negative floats grow with their magnitude (-inf above every
//   finite one) and every non-negative float lies below them.
inline float clamp_exponent(float t) {
  const std::uint32_t u = ::reco::detail::float_bits(t);
  constexpr std::uint32_t floor_bits = exponent_floor<float>::bits;
  return ::reco::detail::float_from_bits(u < floor_bits ? u : floor_bits);
}
inline double clamp_exponent(double t) {
  return t < exponent_floor<double>::value ? exponent_floor<double>::value : t;  // keeps NaN
}
//   min(t, 0): as signed integers, every negative float (-0 included) is negative and every
//   positive one positive.
inline float clamp_nonpositive(float t) {
  const std::int32_t i = static_cast<std::int32_t>(::reco::detail::float_bits(t));
  return ::reco::detail::float_from_bits(static_cast<std::uint32_t>(i < 0 ? i : 0));
}
inline double clamp_nonpositive(double t) { return t > 0 ? 0.0 : t; }

// Branch-free 2^t for t in [-127, 127], so that the loops over a row vectorise without
// -ffast-math: round t to the nearest integer n with the 1.5·2^23 trick (n lands in the low
// mantissa bits), evaluate 2^r, r = t - n in [-1/2, 1/2], by its degree-7 Taylor polynomial
// (truncation < 6e-9 relative), and scale by 2^n through the exponent bits. n = -127 gives a
// zero scale, so 2^t is exactly 0 for t < -126.5 (results below 2^-126 are not needed here).
inline float exp2_vectorisable(float t) {
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23
  const float shifted = t + round_magic;
  // n is read back from the bits, not as shifted - round_magic, which -ffast-math would fold to t.
  const std::int32_t n = static_cast<std::int32_t>(::reco::detail::float_bits(shifted) -
                                                   ::reco::detail::float_bits(round_magic));
  const float r = t - static_cast<float>(n);
  const float scale = ::reco::detail::float_from_bits(static_cast<std::uint32_t>(n + 127) << 23);
  float p = 1.5252733804059838e-05f;
  p = p * r + 1.5403530393381606e-04f;
  p = p * r + 1.3333558146428441e-03f;
  p = p * r + 9.6181291076284770e-03f;
  p = p * r + 5.5504108664821576e-02f;
  p = p * r + 2.4022650695910071e-01f;
  p = p * r + 6.9314718055994531e-01f;
  p = p * r + 1.0f;
  return p * scale;
}
inline float exp2_acc(float t) { return exp2_vectorisable(t); }
inline double exp2_acc(double t) { return std::exp2(t); }

// A signed integer that orders like the float (for non-NaN values): flip the magnitude bits of
// negative numbers so that larger magnitudes give smaller keys. The map is its own inverse.
inline std::int32_t order_key(float f) {
  const std::int32_t i = static_cast<std::int32_t>(::reco::detail::float_bits(f));
  return i ^ ((i >> 31) & 0x7fffffff);
}
inline std::int64_t order_key(double f) {
  std::int64_t i;
  std::memcpy(&i, &f, sizeof i);
  return i ^ ((i >> 63) & 0x7fffffffffffffff);
}
template <class A>
inline A from_order_key(decltype(order_key(A{})) key) {
  const auto i = key ^ ((key >> (8 * sizeof(key) - 1)) & std::numeric_limits<decltype(key)>::max());
  A f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

template <class T>
inline accum_t<T> widen(T v) {
  return static_cast<accum_t<T>>(v);
}
template <class T>
inline T narrow(accum_t<T> v) {
  return T(v);
}

// The per-row sums of the single forward pass, all relative to the running maximum max_x (in
// logit units, before the temperature): s = Σ 2^d, u = Σ 2^d d, w = Σ 2^{2d}, d = (x - max_x) log2(e)/τ.
template <class A>
struct row_sums {
  A max_x, s, u, w;
};

// The sums of two disjoint parts of one row (vocabulary blocks or shards), moved to the larger
// of their maxima exactly as scan_row moves its running sums. A part that saw nothing has
// max_x = lowest and s = u = w = 0 and leaves the other unchanged.
template <class A>
inline row_sums<A> merge_row_sums(const row_sums<A>& a, const row_sums<A>& b, A k) {
  const A m = a.max_x > b.max_x ? a.max_x : b.max_x;
  row_sums<A> out{m, 0, 0, 0};
  for (const row_sums<A>* p : {&a, &b}) {
    const A delta = clamp_exponent((p->max_x - m) * k);
    const A c = exp2_acc(delta);
    out.s += c * p->s;
    out.u += c * (p->u + delta * p->s);
    out.w += c * c * p->w;
  }
  return out;
}

template <class T, bool with_sum_sq>
RECO_LOGITS_CPU_CLONES row_sums<accum_t<T>> scan_row(const T* x, index_t vocab, accum_t<T> k) {
  using A = accum_t<T>;
  constexpr int L = lanes<A>;
  constexpr int C = chunk<A>;
  constexpr A neg_inf = -std::numeric_limits<A>::infinity();
  alignas(64) A buf[C];
  A s[L] = {}, u[L] = {}, w[L] = {};
  int nans = 0;
  // "Nothing seen yet" is the lowest finite value, not -inf, so that (x - m) stays -inf rather
  // than NaN for -inf logits at the start of a row.
  A m = std::numeric_limits<A>::lowest();
  for (index_t c0 = 0; c0 < vocab; c0 += C) {
    const int n = static_cast<int>(std::min<index_t>(C, vocab - c0));
    const int n_padded = (n + L - 1) / L * L;
    for (int j = 0; j < n; ++j) buf[j] = widen(x[c0 + j]);
    for (int j = n; j < n_padded; ++j) buf[j] = neg_inf;  // padding contributes exactly 0
    // The maximum is taken over integer order keys (a float max reduction only vectorises under
    // -ffinite-math-only); NaNs are counted here because the clamps below would hide them.
    auto max_key = order_key(neg_inf);
    for (int j = 0; j < n_padded; ++j) {
      const auto key = order_key(buf[j]);
      max_key = key > max_key ? key : max_key;
      nans += buf[j] != buf[j];
    }
    const A chunk_max = from_order_key<A>(max_key);
    if (chunk_max > m) {
      // Move the running sums to the new maximum: e^{z-m'} = c e^{z-m}, z - m' = (z - m) + delta.
      const A delta = clamp_exponent((m - chunk_max) * k);
      const A c = exp2_acc(delta);
      for (int l = 0; l < L; ++l) {
        u[l] = c * (u[l] + delta * s[l]);
        s[l] *= c;
        if (with_sum_sq) w[l] *= c * c;
      }
      m = chunk_max;
    }
    // Chunk-local partial sums, added once per chunk: a two-level summation whose rounding error
    // grows with chunk/L + vocab/chunk rather than vocab/L.
    A cs[L] = {}, cu[L] = {}, cw[L] = {};
    for (int j = 0; j < n_padded; j += L)
      for (int l = 0; l < L; ++l) {
        const A d = clamp_exponent((buf[j + l] - m) * k);
        const A e = exp2_acc(d);
        cs[l] += e;
        cu[l] += e * d;
        if (with_sum_sq) cw[l] += e * e;
      }
    for (int l = 0; l < L; ++l) {
      s[l] += cs[l];
      u[l] += cu[l];
      if (with_sum_sq) w[l] += cw[l];
    }
  }
  row_sums<A> out{m, 0, 0, 0};
  for (int l = 0; l < L; ++l) {
    out.s += s[l];
    out.u += u[l];
    out.w += w[l];
  }
  if (nans > 0) out.s = std::numeric_limits<A>::quiet_NaN();
  return out;
}

template <class A>
struct gradient_coefficients {
  A lse_x, k, c0, c1, g_y;
};

// One row of dlogits, chunk by chunk: each chunk of x is widened into a buffer before its part of
// dx is written, so dx may be x itself.
template <class T>
RECO_LOGITS_CPU_CLONES void gradient_row(const T* x, T* dx, index_t vocab, index_t y,
                                         const gradient_coefficients<accum_t<T>>& c) {
  using A = accum_t<T>;
  constexpr int C = chunk<A>;
  alignas(64) A buf[C];
  for (index_t col0 = 0; col0 < vocab; col0 += C) {
    const int n = static_cast<int>(std::min<index_t>(C, vocab - col0));
    for (int j = 0; j < n; ++j) buf[j] = widen(x[col0 + j]);
    for (int j = 0; j < n; ++j) {
      // log2 p_j <= 0 up to rounding of the saved LSE; clamping at 0 keeps p_j <= 1.
      const A t = clamp_nonpositive(clamp_exponent((buf[j] - c.lse_x) * c.k));
      buf[j] = exp2_acc(t) * (c.c0 + c.c1 * t);
    }
    if (y >= col0 && y < col0 + n) buf[y - col0] += c.g_y;
    for (int j = 0; j < n; ++j) dx[col0 + j] = narrow<T>(buf[j]);
  }
}

// Small problems run on the calling thread: waking a team costs more than ~64K logits of work.
inline bool worth_threads(index_t rows, index_t vocab) { return rows > 1 && rows * vocab >= (index_t(1) << 16); }

inline void check_problem(bool have_logits, index_t rows, index_t vocab, index_t row_stride, double temperature) {
  using ::reco::detail::require;
  require(rows >= 0, "rows", "must be >= 0, got " + std::to_string(rows));
  require(vocab >= 1, "vocab", "must be >= 1, got " + std::to_string(vocab));
  require(row_stride >= vocab, "row_stride",
          "must be >= vocab (" + std::to_string(vocab) + "), got " + std::to_string(row_stride));
  require(have_logits || rows == 0, "logits", "is null");
  require(std::isfinite(temperature) && temperature > 0, "temperature",
          "must be finite and > 0, got " + std::to_string(temperature));
}

// 1/τ and log2(e)/τ must be finite in the accumulation type A, or every scaled logit overflows
// (a float32 temperature of 1e-300 would otherwise look like a row of -inf logits).
template <class A>
inline void check_temperature_range(double temperature) {
  const double smallest = log2_e / static_cast<double>(std::numeric_limits<A>::max());
  if (temperature < smallest) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.3g is too small: logits / temperature overflow %s (the smallest usable value is %.3g)",
                  temperature, sizeof(A) == 4 ? "float32" : "float64", smallest);
    ::reco::detail::fail("temperature", buf);
  }
}

inline void check_tokens(const std::int64_t* tokens, index_t rows, index_t vocab, const std::uint8_t* row_mask) {
  for (index_t r = 0; r < rows; ++r) {
    if (row_mask && !row_mask[r]) continue;
    const std::int64_t y = tokens[r];
    if (y < 0 || y >= vocab)
      ::reco::detail::fail("tokens", "row " + std::to_string(r) + ": token id " + std::to_string(y) +
                                         " is outside [0, " + std::to_string(vocab) + ")");
  }
}

}  // namespace detail

// Forward: logp, entropy, lse (saved for backward) and optionally sum_p_squared per row. Any
// output pointer may be null; tokens is required when logp is requested.
template <class T>
void forward(const T* logits, index_t rows, index_t vocab, index_t row_stride, const std::int64_t* tokens,
             double temperature, const std::uint8_t* row_mask, accum_t<T>* logp, accum_t<T>* entropy,
             accum_t<T>* lse, accum_t<T>* sum_p_squared = nullptr) {
  static_assert(is_logit_type_v<T>, "reco::logits: logits must be float, double, reco::bf16_t or reco::f16_t");
  using A = accum_t<T>;
  detail::check_problem(logits != nullptr, rows, vocab, row_stride, temperature);
  detail::check_temperature_range<A>(temperature);
  ::reco::detail::require(logp == nullptr || tokens != nullptr || rows == 0, "tokens",
                          "is null but logp is requested");
  if (logp) detail::check_tokens(tokens, rows, vocab, row_mask);

  const A inv_tau = static_cast<A>(1.0 / temperature);
  const A k = static_cast<A>(detail::log2_e / temperature);
  const A ln2 = static_cast<A>(detail::ln_2);
  const A nan = std::numeric_limits<A>::quiet_NaN();
  const A inf = std::numeric_limits<A>::infinity();
  // The first unmasked row with a +inf logit, with every logit -inf, and whose largest logit / τ
  // overflows A: their outputs are NaN, then the first kind found (in that order) is thrown.
  index_t first_pos_inf = rows, first_all_neg_inf = rows, first_overflow = rows;

#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first_pos_inf, first_all_neg_inf, first_overflow) \
    if (detail::worth_threads(rows, vocab))
#endif
  for (index_t r = 0; r < rows; ++r) {
    auto put = [&](A* out, A v) {
      if (out) out[r] = v;
    };
    if (row_mask && !row_mask[r]) {
      put(logp, 0), put(entropy, 0), put(lse, 0), put(sum_p_squared, 0);
      continue;
    }
    const T* x = logits + r * row_stride;
    const detail::row_sums<A> t = sum_p_squared ? detail::scan_row<T, true>(x, vocab, k)
                                                : detail::scan_row<T, false>(x, vocab, k);
    // NaN logits give s = NaN and flow through below; a +inf logit would give NaN or s = 0.
    const bool pos_inf = t.max_x == inf;
    if (pos_inf || t.s == 0) {
      if (pos_inf) first_pos_inf = std::min(first_pos_inf, r);
      else first_all_neg_inf = std::min(first_all_neg_inf, r);
      put(logp, nan), put(entropy, nan), put(lse, nan), put(sum_p_squared, nan);
      continue;
    }
    const A log_s = std::log(t.s);
    const A h = log_s - ln2 * t.u / t.s;
    const A row_lse = t.max_x * inv_tau + log_s;
    if (row_lse == inf || row_lse == -inf) {  // finite logits, but z = x / τ is out of range
      first_overflow = std::min(first_overflow, r);
      put(logp, nan), put(entropy, nan), put(lse, nan), put(sum_p_squared, nan);
      continue;
    }
    put(lse, row_lse);
    put(entropy, h < 0 ? A(0) : h);  // rounding can leave -1 ulp on a one-hot row
    if (logp) logp[r] = (detail::widen(x[tokens[r]]) - t.max_x) * inv_tau - log_s;
    put(sum_p_squared, t.w / (t.s * t.s));
  }
  if (first_pos_inf < rows)
    ::reco::detail::fail("logits", "row " + std::to_string(first_pos_inf) +
                                       ": a logit is +inf (the distribution is undefined)");
  if (first_all_neg_inf < rows)
    ::reco::detail::fail("logits", "row " + std::to_string(first_all_neg_inf) +
                                       ": every logit is -inf (the distribution is undefined)");
  if (first_overflow < rows)
    ::reco::detail::fail("temperature", "row " + std::to_string(first_overflow) + ": logits / temperature (" +
                                            std::to_string(temperature) + ") overflow " +
                                            (sizeof(A) == 4 ? "float32" : "float64") +
                                            " (the temperature is too small for these logits)");
}

// Backward: dlogits (same row_stride as logits; may be logits itself) from the upstream
// gradients of logp and entropy and the lse (and entropy) saved by forward.
template <class T>
void backward(const T* logits, index_t rows, index_t vocab, index_t row_stride, const std::int64_t* tokens,
              double temperature, const std::uint8_t* row_mask, const accum_t<T>* grad_logp,
              const accum_t<T>* grad_entropy, const accum_t<T>* lse, const accum_t<T>* entropy, T* dlogits) {
  static_assert(is_logit_type_v<T>, "reco::logits: logits must be float, double, reco::bf16_t or reco::f16_t");
  using A = accum_t<T>;
  using ::reco::detail::require;
  detail::check_problem(logits != nullptr, rows, vocab, row_stride, temperature);
  require(dlogits != nullptr || rows == 0, "dlogits", "is null");
  require(lse != nullptr || rows == 0, "lse", "is null (pass the lse saved by forward)");
  require(grad_entropy == nullptr || entropy != nullptr, "entropy", "is null but grad_entropy is given");
  require(grad_logp == nullptr || tokens != nullptr || rows == 0, "tokens", "is null but grad_logp is given");
  detail::check_temperature_range<A>(temperature);
  if (grad_logp) detail::check_tokens(tokens, rows, vocab, row_mask);

  const A tau = static_cast<A>(temperature);
  const A inv_tau = static_cast<A>(1.0 / temperature);
  const A k = static_cast<A>(detail::log2_e / temperature);
  const A c1_scale = static_cast<A>(detail::ln_2 / temperature);

#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (detail::worth_threads(rows, vocab))
#endif
  for (index_t r = 0; r < rows; ++r) {
    T* dx = dlogits + r * row_stride;
    if (row_mask && !row_mask[r]) {
      for (index_t j = 0; j < vocab; ++j) dx[j] = detail::narrow<T>(A(0));
      continue;
    }
    const T* x = logits + r * row_stride;
    const A g = grad_logp ? grad_logp[r] : A(0);
    const A g_h = grad_entropy ? grad_entropy[r] : A(0);
    const A h = grad_entropy ? entropy[r] : A(0);
    const index_t y = grad_logp ? static_cast<index_t>(tokens[r]) : index_t(-1);
    // log p_j = (x_j - lse_x) / τ with lse_x = τ·LSE in logit units: the subtraction is exact for
    // x_j near lse_x, which keeps the dominant probabilities accurate. t = log2 p_j.
    const A lse_x = lse[r] * tau;
    if (lse_x != lse_x) {  // a NaN row of forward stays NaN (the clamps below would hide it)
      for (index_t j = 0; j < vocab; ++j) dx[j] = detail::narrow<T>(std::numeric_limits<A>::quiet_NaN());
      continue;
    }
    // dlogits_j = p_j (c0 + c1 t_j) + [j = y] g/τ, from the formula with log p_j = t_j ln 2.
    const detail::gradient_coefficients<A> c{lse_x, k, -(g + g_h * h) * inv_tau, -g_h * c1_scale, g * inv_tau};
    detail::gradient_row(x, dx, vocab, y, c);
  }
}

}  // namespace logits
RECO_NAMESPACE_END
