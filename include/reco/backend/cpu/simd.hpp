// Packs of doubles for the CPU backend's vectorised token pass: a thin wrapper over GCC/Clang
// vector extensions, which the compiler lowers to whatever the target has (SSE2 at the default
// x86-64 level, AVX with -mavx, AVX-512 with -mavx512f), plus the two exponentials the per-token
// math needs, written branch-free so that they vectorise (no libm calls).
//
// The components' math is written over a value type V (reco/detail/math.hpp); lanes<pack<W>>
// below is what lets it run on W tokens at once. Host compilers only: nvcc translation units
// (and compilers without the extensions, or RECO_NO_SIMD) keep the scalar token pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "reco/config.hpp"
#include "reco/detail/math.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(RECO_NO_SIMD)
#define RECO_SIMD 1
#else
#define RECO_SIMD 0
#endif

// Runtime dispatch (x86-64): a translation unit compiled below AVX-512 also carries the token
// pass for AVX2 + FMA (4 doubles, unless the unit is compiled for AVX2 already) and AVX-512
// (8 doubles), and runs the widest the CPU and OS support (simd::dispatch()).
// RECO_NO_SIMD_DISPATCH keeps the compile-time width only; RECO_NO_SIMD_AVX512 leaves the AVX-512
// variant out (a build for machines without it compiles a third less token-pass code: CI's test
// build on a CPU without AVX-512, where that variant could never run). Define either for every
// unit of a program, not for some: the variants are inline functions the units share.
#if RECO_SIMD && defined(__x86_64__) && !defined(__AVX512F__) && !defined(RECO_NO_SIMD_DISPATCH)
#define RECO_SIMD_DISPATCH 1
#if defined(__AVX2__) && defined(__FMA__)
#define RECO_SIMD_DISPATCH_AVX2 0
#else
#define RECO_SIMD_DISPATCH_AVX2 1
#endif
#if defined(RECO_NO_SIMD_AVX512)
#define RECO_SIMD_DISPATCH_AVX512 0
#else
#define RECO_SIMD_DISPATCH_AVX512 1
#endif
#else
#define RECO_SIMD_DISPATCH 0
#define RECO_SIMD_DISPATCH_AVX2 0
#define RECO_SIMD_DISPATCH_AVX512 0
#endif

#if RECO_SIMD

// Packs wider than the unit's instruction set are only ever used inside always-inlined code of
// the dispatched variants; GCC's note that their by-value calling convention differs between
// instruction sets does not apply and is silenced.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(RECO_NO_FORCE_INLINE)
#if RECO_SIMD_DISPATCH
#error "RECO_NO_FORCE_INLINE needs RECO_NO_SIMD_DISPATCH: the dispatched variants must inline every pack function"
#endif
#define RECO_SIMD_INLINE inline
#else
#define RECO_SIMD_INLINE inline __attribute__((always_inline))
#endif
// A dispatched variant: compiled for the named instruction set with every call below it inlined,
// so that the packs' generic vector operations are lowered to that set.
#define RECO_SIMD_TARGET_AVX2 __attribute__((target("avx2,fma"), flatten))
#define RECO_SIMD_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"), flatten))

RECO_NAMESPACE_BEGIN
namespace simd {

// Doubles per pack: one vector register of the target (RECO_SIMD_WIDTH overrides; a power of 2).
#if defined(RECO_SIMD_WIDTH)
inline constexpr int width = RECO_SIMD_WIDTH;
#elif defined(__AVX512F__)
inline constexpr int width = 8;
#elif defined(__AVX__)
inline constexpr int width = 4;
#else
inline constexpr int width = 2;
#endif

// The vector types of a width. (Spelled out per width: GCC drops vector_size on a typedef whose
// size depends on a template parameter.)
template <int W>
struct vectors;
#define RECO_SIMD_VECTORS(W)                                                        \
  template <>                                                                       \
  struct vectors<W> {                                                               \
    typedef double f64 __attribute__((vector_size(8 * W)));                         \
    typedef float f32 __attribute__((vector_size(4 * W)));                          \
    typedef std::int64_t i64 __attribute__((vector_size(8 * W)));                   \
    typedef std::uint64_t u64 __attribute__((vector_size(8 * W)));                  \
    typedef std::uint8_t u8 __attribute__((vector_size(W)));                        \
  };
RECO_SIMD_VECTORS(2)
RECO_SIMD_VECTORS(4)
RECO_SIMD_VECTORS(8)
#undef RECO_SIMD_VECTORS

#if RECO_SIMD_DISPATCH
enum class level { baseline, avx2, avx512 };

// The widest level this CPU and its OS run, chosen once per process. The environment variable
// RECO_SIMD_LEVEL caps it ("baseline" or "avx2"): results differ between levels in the last bits
// (lane count and fused multiply-adds change the rounding), so a cap reproduces one machine's
// bits on another.
inline level dispatch() {
  static const level chosen = [] {
    __builtin_cpu_init();
    level l = level::baseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      l = level::avx2;
#if RECO_SIMD_DISPATCH_AVX512
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        l = level::avx512;
#endif
    }
    if (const char* cap = std::getenv("RECO_SIMD_LEVEL")) {
      if (std::strcmp(cap, "baseline") == 0) l = level::baseline;
      if (std::strcmp(cap, "avx2") == 0 && l == level::avx512) l = level::avx2;
    }
    return l;
  }();
  return chosen;
}
#endif

// The instruction set and pack width the packed token pass runs with in this unit, dispatch
// included (for reports: the benchmarks print them).
inline const char* active_isa() {
#if RECO_SIMD_DISPATCH
  if (dispatch() == level::avx512) return "AVX-512";
#if RECO_SIMD_DISPATCH_AVX2
  if (dispatch() == level::avx2) return "AVX2+FMA";
#endif
#endif
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2";
#else
  return "generic vectors";
#endif
}
inline int active_width() {
#if RECO_SIMD_DISPATCH
  if (dispatch() == level::avx512) return 8;
#if RECO_SIMD_DISPATCH_AVX2
  if (dispatch() == level::avx2) return 4;
#endif
#endif
  return width;
}

// A comparison's 0 / -1 lanes as a mask, through an empty asm that g++ cannot see into. Without
// it g++ 12 folds a 512-bit comparison into the boolean operations and selects that follow it
// and lowers the folded forms to a scalar compare per lane, inside the AVX-512 variant (a third
// of the token pass's instructions for grpo: vcomiss / seta / vpinsrd per lane); with it the
// comparison stays one instruction and its mask a register. Values are not changed.
// (Only for vectors a register of the code's instruction set holds: the unit's own, or the
// dispatched variants' wider ones, which only those variants use.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECO_SIMD_OPAQUE_MASKS 1
#if defined(__AVX512F__)
inline constexpr std::size_t register_bytes = 64;
#elif defined(__AVX__)
inline constexpr std::size_t register_bytes = 32;
#else
inline constexpr std::size_t register_bytes = 16;
#endif
template <std::size_t Bytes>
inline constexpr bool fits_register = Bytes <= register_bytes
#if !defined(RECO_SIMD_WIDTH)
                                      || (Bytes == 32 && RECO_SIMD_DISPATCH_AVX2) || (Bytes == 64 && RECO_SIMD_DISPATCH_AVX512)
#endif
    ;
#else
#define RECO_SIMD_OPAQUE_MASKS 0
#endif
template <class Mask, class Raw>
RECO_SIMD_INLINE Mask opaque_mask(const Raw& comparison) {
  typename Mask::raw r = (typename Mask::raw)comparison;
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (fits_register<sizeof(r)>) __asm__("" : "+v"(r));
#endif
  return Mask(r);
}

// A truth value per lane: all ones or all zeros (what vector comparisons give).
template <int W>
struct mask {
  typedef typename vectors<W>::i64 raw;
  raw v;
  RECO_SIMD_INLINE mask() : v(raw{}) {}
  RECO_SIMD_INLINE mask(bool b) : v(raw{} - static_cast<std::int64_t>(b)) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE explicit mask(const raw& r) : v(r) {}
  // Bitwise: the comparisons' results are opaque (opaque_mask), so g++ cannot fold these into
  // the forms it lowers to a scalar compare per lane.
  friend RECO_SIMD_INLINE mask operator&&(const mask& a, const mask& b) { return mask(a.v & b.v); }
  friend RECO_SIMD_INLINE mask operator||(const mask& a, const mask& b) { return mask(a.v | b.v); }
  friend RECO_SIMD_INLINE mask operator!(const mask& a) { return mask(~a.v); }
};

template <int W>
struct counter;

template <int W>
struct pack {
  typedef typename vectors<W>::f64 raw;
  using mask_type = mask<W>;
  using counter_type = counter<W>;
  static constexpr int size = W;
  raw v;
  RECO_SIMD_INLINE pack() : v(raw{}) {}
  RECO_SIMD_INLINE pack(double d) : v(raw{} + d) {}  // NOLINT: broadcast, as for double
  RECO_SIMD_INLINE explicit pack(const raw& r) : v(r) {}
  RECO_SIMD_INLINE double operator[](int k) const { return v[k]; }

  friend RECO_SIMD_INLINE pack operator+(const pack& a, const pack& b) { return pack(a.v + b.v); }
  friend RECO_SIMD_INLINE pack operator-(const pack& a, const pack& b) { return pack(a.v - b.v); }
  friend RECO_SIMD_INLINE pack operator*(const pack& a, const pack& b) { return pack(a.v * b.v); }
  friend RECO_SIMD_INLINE pack operator/(const pack& a, const pack& b) { return pack(a.v / b.v); }
  friend RECO_SIMD_INLINE pack operator-(const pack& a) { return pack(-a.v); }
  RECO_SIMD_INLINE pack& operator+=(const pack& b) { v += b.v; return *this; }

  // Comparisons give a vector of 0 / -1 integers of the same width; the cast only renames it.
  friend RECO_SIMD_INLINE mask_type operator<(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v < b.v); }
  friend RECO_SIMD_INLINE mask_type operator>(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v > b.v); }
  friend RECO_SIMD_INLINE mask_type operator<=(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v <= b.v); }
  friend RECO_SIMD_INLINE mask_type operator>=(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v >= b.v); }
  friend RECO_SIMD_INLINE mask_type operator==(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v == b.v); }
  friend RECO_SIMD_INLINE mask_type operator!=(const pack& a, const pack& b) { return opaque_mask<mask_type>(a.v != b.v); }
};

template <int W>
RECO_SIMD_INLINE pack<W> select(const mask<W>& m, const pack<W>& a, const pack<W>& b) {
  typedef typename mask<W>::raw bits;
  return pack<W>((typename pack<W>::raw)((m.v & (bits)a.v) | (~m.v & (bits)b.v)));
}

// a < b ? a : b and a > b ? a : b per lane: x86's minpd / maxpd (one instruction where GCC
// would otherwise spell out the select): the intrinsic for the unit's own instruction set, the
// instruction in asm for the dispatched variants' wider packs (GCC and Clang reject the wider
// intrinsics there).
template <int W>
RECO_SIMD_INLINE pack<W> min_of(const pack<W>& a, const pack<W>& b) {
  typedef typename pack<W>::raw raw;
#if defined(__AVX512F__)
  // (The masked form: GCC 12 warns about the unmasked one's undefined pass-through operand.)
  if constexpr (W == 8) return pack<W>((raw)_mm512_mask_min_pd((__m512d)a.v, 0xFF, (__m512d)a.v, (__m512d)b.v));
#endif
#if defined(__AVX__)
  if constexpr (W == 4) return pack<W>((raw)_mm256_min_pd((__m256d)a.v, (__m256d)b.v));
#endif
#if defined(__SSE2__)
  if constexpr (W == 2) return pack<W>((raw)_mm_min_pd((__m128d)a.v, (__m128d)b.v));
#endif
#if RECO_SIMD_OPAQUE_MASKS
  // The dispatched variants' wider packs: the instruction through asm (their intrinsics cannot be
  // inlined here).
  if constexpr ((W == 8 || W == 4) && fits_register<8 * W>) {
    raw r;
    if constexpr (W == 8) __asm__("vminpd %2, %1, %0" : "=v"(r) : "v"(a.v), "v"(b.v));
    else __asm__("vminpd %2, %1, %0" : "=x"(r) : "x"(a.v), "x"(b.v));
    return pack<W>(r);
  }
#endif
  return select(a < b, a, b);
}
template <int W>
RECO_SIMD_INLINE pack<W> max_of(const pack<W>& a, const pack<W>& b) {
  typedef typename pack<W>::raw raw;
#if defined(__AVX512F__)
  // (The masked form: GCC 12 warns about the unmasked one's undefined pass-through operand.)
  if constexpr (W == 8) return pack<W>((raw)_mm512_mask_max_pd((__m512d)a.v, 0xFF, (__m512d)a.v, (__m512d)b.v));
#endif
#if defined(__AVX__)
  if constexpr (W == 4) return pack<W>((raw)_mm256_max_pd((__m256d)a.v, (__m256d)b.v));
#endif
#if defined(__SSE2__)
  if constexpr (W == 2) return pack<W>((raw)_mm_max_pd((__m128d)a.v, (__m128d)b.v));
#endif
#if RECO_SIMD_OPAQUE_MASKS
  // The dispatched variants' wider packs: the instruction through asm (their intrinsics cannot be
  // inlined here).
  if constexpr ((W == 8 || W == 4) && fits_register<8 * W>) {
    raw r;
    if constexpr (W == 8) __asm__("vmaxpd %2, %1, %0" : "=v"(r) : "v"(a.v), "v"(b.v));
    else __asm__("vmaxpd %2, %1, %0" : "=x"(r) : "x"(a.v), "x"(b.v));
    return pack<W>(r);
  }
#endif
  return select(a > b, a, b);
}

// ---- exp and expm1 ------------------------------------------------------------------------------
//
// x = k ln2 + r with k = round(x / ln2), |r| <= ln2 / 2 (Cody-Waite: ln2 split in two so that
// k ln2_hi is exact), p = expm1(r) by a polynomial, then
//   exp(x) = 2^k (1 + p),   expm1(x) = 2^k p + (2^k - 1).
// k is read from the mantissa of x / ln2 + 1.5 * 2^52 (no float-to-integer conversion), and 2^k
// is applied as two factors 2^k1 2^k2, each a normal number, so that results in the subnormal
// range round once and overflow gives inf. About 1 ulp (tested against libm in tests/core).

template <int W>
struct exp_parts {
  pack<W> p;       // expm1(r)
  pack<W> k;       // the integer k, as a double
  pack<W> s1, s2;  // 2^k = s1 s2, both normal numbers
  pack<W> inv_s1;  // 1 / s1
};

// The reduction of an x the caller keeps within the clamp below (or NaN): no clamp of its own.
template <int W>
RECO_SIMD_INLINE exp_parts<W> reduce_exp_within(const pack<W>& x) {
  typedef typename vectors<W>::u64 u64;
  const double shifter = 0x1.8p52;
  const pack<W> shifted = x * 0x1.71547652b82fep0 + shifter;  // x / ln2, rounded to an integer
  const pack<W> k = shifted - shifter;
  const pack<W> r = (x - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
  // expm1(r) = r + r^2 q(r): q is the Chebyshev fit of degree 9 on [-ln2/2, ln2/2] (error
  // 1e-16 in q, 4e-17 relative in p), evaluated by Estrin's scheme: a dependency chain of depth
  // 4 instead of Horner's 9, so that out-of-order execution overlaps the three or four
  // exponentials of a token.
  const pack<W> r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const pack<W> q01 = 0x1.5555555555556p-3 * r + 0x1.0000000000001p-1;
  const pack<W> q23 = 0x1.11111111109b5p-7 * r + 0x1.5555555553d68p-5;
  const pack<W> q45 = 0x1.a01a01a7c2efep-13 * r + 0x1.6c16c17889ef1p-10;
  const pack<W> q67 = 0x1.71de0db2f6b19p-19 * r + 0x1.a019b9149a41cp-16;
  const pack<W> q89 = 0x1.af389ecfc4b9cp-26 * r + 0x1.28917c89a43a7p-22;
  const pack<W> q = (q01 + q23 * r2) + (q45 + q67 * r2) * r4 + q89 * r8;
  exp_parts<W> e;
  e.p = r + r2 * q;
  e.k = k;
  // k = (bits of shifted) - (bits of the shifter): both lie in [2^52, 2^53), one unit apart per 1.
  // With b = k + 2046 (> 0), b >> 1 = k1 + 1023 and b - (b >> 1) = k2 + 1023 are the biased
  // exponents of s1 = 2^k1, k1 = floor(k / 2), and of s2 = 2^(k - k1).
  const u64 b = (u64)shifted.v - (u64)pack<W>(shifter).v + 2046u;
  const u64 e1 = b >> 1;
  e.s1 = pack<W>((typename pack<W>::raw)(e1 << 52));
  e.s2 = pack<W>((typename pack<W>::raw)((b - e1) << 52));
  e.inv_s1 = pack<W>((typename pack<W>::raw)((2046u - e1) << 52));
  return e;
}
template <int W>
RECO_SIMD_INLINE exp_parts<W> reduce_exp(const pack<W>& input) {
  // Beyond these bounds exp is 0 or inf anyway; the clamp keeps k within the split's range
  // (NaN passes through and gives NaN).
  return reduce_exp_within(min_of(pack<W>(710.0), max_of(pack<W>(-746.0), input)));
}

// (1 + p) 2^k: AVX-512's scalef, one instruction that rounds once as the two products do (the
// first is exact), where the pack is a 512-bit register; the two products elsewhere.
template <int W>
RECO_SIMD_INLINE pack<W> exp_from(const exp_parts<W>& e) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (W == 8 && fits_register<64>) {
    typename pack<W>::raw r;
    __asm__("vscalefpd %2, %1, %0" : "=v"(r) : "v"((pack<W>(1.0) + e.p).v), "v"(e.k.v));
    return pack<W>(r);
  }
#endif
  return (e.s1 * (pack<W>(1.0) + e.p)) * e.s2;
}
// 2^k p + 2^k - 1 = s1 (s2 p + (s2 - 1 / s1)): s2 - 1/s1 is exact up to k = 52 (beyond, the 1
// is below the rounding of 2^k anyway), the sum rounds once and the scaling by s1 is exact,
// with no overflow before expm1 itself overflows. k = 0 gives p exactly.
template <int W>
RECO_SIMD_INLINE pack<W> expm1_from(const exp_parts<W>& e) {
  return e.s1 * (e.s2 * e.p + (e.s2 - e.inv_s1));
}

template <int W>
RECO_SIMD_INLINE pack<W> exp(const pack<W>& x) {
  return exp_from(reduce_exp(x));
}
template <int W>
RECO_SIMD_INLINE pack<W> expm1(const pack<W>& x) {
  return expm1_from(reduce_exp(x));
}
// exp(x) for an x the caller keeps within |x| <= 64: the same value without the range clamp.
template <int W>
RECO_SIMD_INLINE pack<W> exp_within(const pack<W>& x) {
  return exp_from(reduce_exp_within(x));
}

// ---- loads and stores ---------------------------------------------------------------------------

// Each lane's index, 0 to W - 1, as 64-bit integers into v: built in memory and loaded whole (a
// vector set lane by lane through a variable index is kept in memory, and with it whatever holds
// it). An out parameter: a returned 256- or 512-bit vector draws g++'s ABI warning at callers.
template <int W>
RECO_SIMD_INLINE void set_lane_indices(typename vectors<W>::u64& v) {
  std::uint64_t k[W];
  for (int j = 0; j < W; ++j) k[j] = static_cast<std::uint64_t>(j);
  std::memcpy(&v, k, sizeof v);
}
// Lanes [0, n) on.
template <int W>
RECO_SIMD_INLINE mask<W> first_lanes(int n) {
  typename mask<W>::raw iota{};
  for (int k = 0; k < W; ++k) iota[k] = k;
  // Opaque as every comparison's mask: g++ 12 -O3 stopped with an internal compiler error
  // (do_store_flag) expanding this one, folded into a double-lane token pass's AVX-512 variant.
  return opaque_mask<mask<W>>(iota < n);
}

template <int W, class T>
RECO_SIMD_INLINE pack<W> load(const T* src) {
#if defined(__SSE2__)
  // Two floats: one 8-byte load and cvtps2pd (GCC would convert them one by one).
  if constexpr (sizeof(T) == 4 && W == 2) {
    double two;
    std::memcpy(&two, src, sizeof(two));
    return pack<W>((typename pack<W>::raw)_mm_cvtps_pd(_mm_castpd_ps(_mm_set_sd(two))));
  }
#endif
#if RECO_SIMD_OPAQUE_MASKS
  // Eight floats: one vcvtps2pd into the whole register (g++ 12 converts the two halves apart
  // and joins them: five instructions for two).
  if constexpr (sizeof(T) == 4 && W == 8 && fits_register<64>) {
    typename vectors<8>::f32 v;
    std::memcpy(&v, src, sizeof(v));
    typename pack<8>::raw r;
    __asm__("vcvtps2pd %1, %0" : "=v"(r) : "vm"(v));
    return pack<8>(r);
  }
#endif
  if constexpr (sizeof(T) == 8) {
    typename pack<W>::raw v;
    std::memcpy(&v, src, sizeof(v));
    return pack<W>(v);
  } else {
    static_assert(sizeof(T) == 4, "float or double");
    typename vectors<W>::f32 v;
    std::memcpy(&v, src, sizeof(v));
    return pack<W>(__builtin_convertvector(v, typename pack<W>::raw));
  }
}
// The first n < W values; 0 in the other lanes (nothing is read past src + n).
template <int W, class T>
RECO_SIMD_INLINE pack<W> load_first(const T* src, int n) {
  T buf[W] = {};
  for (int k = 0; k < n; ++k) buf[k] = src[k];
  return load<W>(buf);
}
// Nonzero bytes (masks, kept flags).
template <int W>
RECO_SIMD_INLINE mask<W> load_flags(const std::uint8_t* src) {
  typedef typename mask<W>::raw i64;
  if constexpr (W >= 4) {
    // The W bytes as one word, broadcast, each lane shifted to its own byte: a broadcast, a
    // variable shift and a compare. g++ 12 turns the byte-to-lane conversion below into a byte
    // extraction and an insert per lane (at 8 lanes the plan's old_logp scan took 0.77 ms with
    // it and 0.67 ms without, 1M tokens on a Zen 4 guest; the call's passes gained 5-8 %).
    typedef typename vectors<W>::u64 u64;
    std::uint64_t word = 0;
    std::memcpy(&word, src, W);
    u64 shift;
    for (int k = 0; k < W; ++k) shift[k] = static_cast<std::uint64_t>(8 * k);
    const u64 lanes = u64{} + word;
    return mask<W>((i64)(((lanes >> shift) & 0xffu) != 0));
  } else {
    typename vectors<W>::u8 v;
    std::memcpy(&v, src, sizeof(v));
    return mask<W>((i64)(__builtin_convertvector(v, i64) != 0));
  }
}
template <int W>
RECO_SIMD_INLINE mask<W> load_first_flags(const std::uint8_t* src, int n) {
  std::uint8_t buf[W] = {};
  for (int k = 0; k < n; ++k) buf[k] = src[k];
  return load_flags<W>(buf);
}
// The lanes of a pack of tokens that hold valid ones: all W (Full) or the first n, and of those
// the ones whose flag is nonzero when there is a mask (flags = the mask at the pack's first token).
template <int W, bool Full>
RECO_SIMD_INLINE mask<W> valid_lanes(const std::uint8_t* flags, int n) {
  const mask<W> in = Full ? mask<W>(true) : first_lanes<W>(n);
  if (!flags) return in;
  return in && (Full ? load_flags<W>(flags) : load_first_flags<W>(flags, n));
}

template <int W, class T>
RECO_SIMD_INLINE void store(T* dst, const pack<W>& x) {
#if defined(__SSE2__)
  if constexpr (sizeof(T) == 4 && W == 2) {
    const double two = _mm_cvtsd_f64(_mm_castps_pd(_mm_cvtpd_ps((__m128d)x.v)));
    std::memcpy(dst, &two, sizeof(two));
    return;
  }
#endif
  if constexpr (sizeof(T) == 8) {
    std::memcpy(dst, &x.v, sizeof(x.v));
  } else {
    static_assert(sizeof(T) == 4, "float or double");
    const typename vectors<W>::f32 v = __builtin_convertvector(x.v, typename vectors<W>::f32);
    std::memcpy(dst, &v, sizeof(v));
  }
}
template <int W, class T>
RECO_SIMD_INLINE void store_first(T* dst, const pack<W>& x, int n) {
  T buf[W];
  store<W>(buf, x);
  for (int k = 0; k < n; ++k) dst[k] = buf[k];
}

// Whether this unit's AVX-512 code keeps lanes' truth values in mask registers (k0-k7) instead of
// vectors of 0 / -1 lanes: 8 double lanes here (kmask8), 16 float lanes below (kmask16). Loops that
// only test, add and compress then take a comparison's mask as it is, where a vector costs a blend
// to make and a test to read back at each use. Through asm: the dispatched variants cannot inline
// AVX-512 intrinsics from generic code.
#if RECO_SIMD_OPAQUE_MASKS
inline constexpr bool kmask_registers = fits_register<64>;
#else
inline constexpr bool kmask_registers = false;
#endif
#if RECO_SIMD_OPAQUE_MASKS
// The mask-register operations the two mask types share: a | b, and the lanes as an integer's bits
// (a general-purpose register).
RECO_SIMD_INLINE std::uint16_t kor(std::uint16_t a, std::uint16_t b) {
  std::uint16_t r;
  __asm__("korw %2, %1, %0" : "=k"(r) : "k"(a), "k"(b));
  return r;
}
RECO_SIMD_INLINE std::uint32_t kbits(std::uint16_t k) {
  std::uint32_t r;
  __asm__("kmovw %1, %0" : "=r"(r) : "k"(k));
  return r;
}
#endif
struct kmask8 {
  std::uint16_t v = 0;
#if RECO_SIMD_OPAQUE_MASKS
  friend RECO_SIMD_INLINE kmask8 operator||(const kmask8& a, const kmask8& b) {
    kmask8 r;
    r.v = kor(a.v, b.v);
    return r;
  }
  RECO_SIMD_INLINE std::uint32_t bits() const { return kbits(v); }
#endif
};
#if RECO_SIMD_OPAQUE_MASKS
// The lanes of a mask<8> vector.
RECO_SIMD_INLINE kmask8 k8_of(const mask<8>& m) {
  kmask8 r;
  __asm__("vptestmq %1, %1, %0" : "=k"(r.v) : "v"(m.v));
  return r;
}
// The lanes whose byte at src is nonzero (8 bytes).
RECO_SIMD_INLINE kmask8 k8_flags(const std::uint8_t* src) {
  std::uint64_t word;
  std::memcpy(&word, src, sizeof word);
  typedef std::uint8_t bytes16 __attribute__((vector_size(16)));
  const bytes16 b = (bytes16)(typename vectors<2>::u64{word, 0});
  kmask8 r;
  __asm__("vptestmb %1, %1, %0" : "=k"(r.v) : "v"(b));
  return r;
}
// The lanes with lo < x <= hi (false for NaN).
RECO_SIMD_INLINE kmask8 k8_in_band(const pack<8>& x, const pack<8>& lo, const pack<8>& hi) {
  kmask8 above, r;
  __asm__("vcmppd $0x1e, %2, %1, %0" : "=k"(above.v) : "v"(x.v), "v"(lo.v));
  __asm__("vcmppd $0x12, %2, %1, %0%{%3%}" : "=k"(r.v) : "v"(x.v), "v"(hi.v), "Yk"(above.v));
  return r;
}
// s + x on the lanes of m, s elsewhere.
RECO_SIMD_INLINE void k8_add(pack<8>& s, const pack<8>& x, const kmask8& m) {
  __asm__("vaddpd %2, %0, %0%{%1%}" : "+v"(s.v) : "Yk"(m.v), "v"(x.v));
}
RECO_SIMD_INLINE bool any(const kmask8& m) { return m.bits() != 0; }
// compress_lanes (below) with the lanes in a mask register: one compress and one store.
RECO_SIMD_INLINE int compress_lanes(const typename vectors<8>::u64& x, const kmask8& m, std::uint64_t* out) {
  typename vectors<8>::u64 c;
  __asm__("vpcompressq %1, %0%{%2%}%{z%}" : "=v"(c) : "v"(x), "Yk"(m.v));
  // A store of 64-bit lanes (not memcpy's bytes, which may alias anything): the caller's count
  // stays in a register.
  typedef std::uint64_t unaligned_u64 __attribute__((vector_size(64), aligned(8)));
  *reinterpret_cast<unaligned_u64*>(out) = c;
  return __builtin_popcount(m.bits());
}
#endif

// Per-lane "any": whether some lane is on. In the wide variants one test of the whole register
// (vptestmq, vptest) instead of a move of each lane to a general-purpose register.
template <int W>
RECO_SIMD_INLINE bool any(const mask<W>& m) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (W == 8 && fits_register<64>) return any(k8_of(m));
  if constexpr (W == 4 && fits_register<32>) {
    bool on;
    __asm__("vptest %1, %1" : "=@ccnz"(on) : "x"(m.v));
    return on;
  }
#endif
  std::int64_t bits = 0;
  for (int k = 0; k < W; ++k) bits |= m.v[k];
  return bits != 0;
}

// The lanes of x that m holds, in lane order, to out[0, 1, ...]; returns how many. Writes W
// values at out whichever lanes are on (out needs room for W). One compress and one store in the
// AVX-512 variant; a branch-free store per lane elsewhere.
template <int W>
RECO_SIMD_INLINE int compress_lanes(const typename vectors<W>::u64& x, const mask<W>& m, std::uint64_t* out) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (W == 8 && fits_register<64>) return compress_lanes(x, k8_of(m), out);
#endif
  int n = 0;
  for (int k = 0; k < W; ++k) {
    out[n] = x[k];
    n += static_cast<int>(m.v[k] & 1);
  }
  return n;
}

// ---- reductions across lanes (fixed order: lane 0 first) ----------------------------------------

template <int W>
RECO_SIMD_INLINE double sum_lanes(const pack<W>& x) {
  double s = x.v[0];
  for (int k = 1; k < W; ++k) s += x.v[k];
  return s;
}
template <int W>
RECO_SIMD_INLINE double min_lanes(const pack<W>& x) {
  double s = x.v[0];
  for (int k = 1; k < W; ++k) s = x.v[k] < s ? x.v[k] : s;
  return s;
}
template <int W>
RECO_SIMD_INLINE double max_lanes(const pack<W>& x) {
  double s = x.v[0];
  for (int k = 1; k < W; ++k) s = x.v[k] > s ? x.v[k] : s;
  return s;
}

// Per-lane counters: subtracting a mask (-1 where on) adds one per lane that is on.
template <int W>
struct counter {
  typename mask<W>::raw n{};
  RECO_SIMD_INLINE void add(const mask<W>& m) { n -= m.v; }
  RECO_SIMD_INLINE void add(const counter& c) { n += c.n; }
  RECO_SIMD_INLINE double total() const {
    std::int64_t s = 0;
    for (int k = 0; k < W; ++k) s += n[k];
    return static_cast<double>(s);
  }
};

// ---- packs of floats ----------------------------------------------------------------------------
//
// The token pass of float inputs computes in float (docs/conventions.md, "Precision"): a pack of
// 2W floats fills the register a pack of W doubles fills, so a pass sees twice the tokens per
// instruction. Sums leave the floats at once: accumulate() widens a float pack into a double
// pack, so every reduction stays in double. Masks hold 32-bit lanes (what float comparisons give).

template <int W>
struct fvectors;
#define RECO_SIMD_FVECTORS(W)                                      \
  template <>                                                      \
  struct fvectors<W> {                                             \
    typedef float f32 __attribute__((vector_size(4 * W)));         \
    typedef std::int32_t i32 __attribute__((vector_size(4 * W)));  \
    typedef std::uint32_t u32 __attribute__((vector_size(4 * W))); \
    typedef std::uint8_t u8 __attribute__((vector_size(W)));       \
  };
RECO_SIMD_FVECTORS(4)
RECO_SIMD_FVECTORS(8)
RECO_SIMD_FVECTORS(16)
#undef RECO_SIMD_FVECTORS

template <int L>
struct fmask {
  typedef typename fvectors<L>::i32 raw;
  raw v;
  RECO_SIMD_INLINE fmask() : v(raw{}) {}
  RECO_SIMD_INLINE fmask(bool b) : v(raw{} - static_cast<std::int32_t>(b)) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE explicit fmask(const raw& r) : v(r) {}
  friend RECO_SIMD_INLINE fmask operator&&(const fmask& a, const fmask& b) { return fmask(a.v & b.v); }
  friend RECO_SIMD_INLINE fmask operator||(const fmask& a, const fmask& b) { return fmask(a.v | b.v); }
  friend RECO_SIMD_INLINE fmask operator!(const fmask& a) { return fmask(~a.v); }
};

// Per-lane counters of a float mask (32-bit lanes: a segment is one response's tokens).
template <int L>
struct fcounter {
  typename fmask<L>::raw n{};
  RECO_SIMD_INLINE void add(const fmask<L>& m) { n -= m.v; }
  RECO_SIMD_INLINE void add(const fcounter& c) { n += c.n; }
  RECO_SIMD_INLINE double total() const {
    std::int64_t s = 0;
    for (int k = 0; k < L; ++k) s += n[k];
    return static_cast<double>(s);
  }
};

// AVX-512 code keeps the 16 lanes' truth values of a 16-float pack in a mask register (k0-k7),
// one bit per lane: a comparison is one instruction, a select one blend, a count a popcnt, and
// the masks take none of the 32 vector registers the per-token math needs (as vectors of 0 / -1
// lanes they pushed its constants and sums to the stack). Through asm, as the min / max above:
// the dispatched variants cannot inline AVX-512 intrinsics from generic code.
inline constexpr bool float_kmasks = kmask_registers;

struct kmask16 {
  std::uint16_t v;
  RECO_SIMD_INLINE kmask16() : v(0) {}
  RECO_SIMD_INLINE kmask16(bool b) : v(b ? 0xffffu : 0u) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE static kmask16 of_bits(std::uint32_t bits) {
    kmask16 m;
    m.v = static_cast<std::uint16_t>(bits);
    return m;
  }
#if RECO_SIMD_OPAQUE_MASKS
  friend RECO_SIMD_INLINE kmask16 operator&&(const kmask16& a, const kmask16& b) {
    kmask16 r;
    __asm__("kandw %2, %1, %0" : "=k"(r.v) : "k"(a.v), "k"(b.v));
    return r;
  }
  friend RECO_SIMD_INLINE kmask16 operator||(const kmask16& a, const kmask16& b) {
    kmask16 r;
    r.v = kor(a.v, b.v);
    return r;
  }
  friend RECO_SIMD_INLINE kmask16 operator!(const kmask16& a) {
    kmask16 r;
    __asm__("knotw %1, %0" : "=k"(r.v) : "k"(a.v));
    return r;
  }
  // The lanes as an integer's bits (a general-purpose register).
  RECO_SIMD_INLINE std::uint32_t bits() const { return v; }
#else
  friend RECO_SIMD_INLINE kmask16 operator&&(const kmask16& a, const kmask16& b) { return of_bits(a.v & b.v); }
  friend RECO_SIMD_INLINE kmask16 operator||(const kmask16& a, const kmask16& b) { return of_bits(a.v | b.v); }
  friend RECO_SIMD_INLINE kmask16 operator!(const kmask16& a) { return of_bits(~a.v & 0xffffu); }
  RECO_SIMD_INLINE std::uint32_t bits() const { return v; }
#endif
};

// The count of a mask register's lanes: one integer, exact (popcnt on the side of the vector
// units).
struct kcounter {
  std::int64_t n = 0;
  RECO_SIMD_INLINE void add(const kmask16& m) { n += __builtin_popcount(m.bits()); }
  RECO_SIMD_INLINE void add(const kcounter& c) { n += c.n; }
  RECO_SIMD_INLINE double total() const { return static_cast<double>(n); }
};

// The mask and counter types of a float pack: mask registers where AVX-512 code holds it.
template <int L>
struct fmask_types {
  using mask = fmask<L>;
  using counter = fcounter<L>;
};
template <>
struct fmask_types<16> {
  using mask = std::conditional_t<float_kmasks, kmask16, fmask<16>>;
  using counter = std::conditional_t<float_kmasks, kcounter, fcounter<16>>;
};
template <int L>
inline constexpr bool uses_kmask = std::is_same_v<typename fmask_types<L>::mask, kmask16>;

template <int L>
struct fpack {
  typedef typename fvectors<L>::f32 raw;
  using mask_type = typename fmask_types<L>::mask;
  using counter_type = typename fmask_types<L>::counter;
  static constexpr int size = L;
  raw v;
  RECO_SIMD_INLINE fpack() : v(raw{}) {}
  // Broadcast of a double (constants and per-response values) rounded to float, as for float.
  RECO_SIMD_INLINE fpack(double d) : v(raw{} + static_cast<float>(d)) {}  // NOLINT: broadcast
  RECO_SIMD_INLINE explicit fpack(const raw& r) : v(r) {}
  RECO_SIMD_INLINE float operator[](int k) const { return v[k]; }

  friend RECO_SIMD_INLINE fpack operator+(const fpack& a, const fpack& b) { return fpack(a.v + b.v); }
  friend RECO_SIMD_INLINE fpack operator-(const fpack& a, const fpack& b) { return fpack(a.v - b.v); }
  friend RECO_SIMD_INLINE fpack operator*(const fpack& a, const fpack& b) { return fpack(a.v * b.v); }
  friend RECO_SIMD_INLINE fpack operator/(const fpack& a, const fpack& b) { return fpack(a.v / b.v); }
  friend RECO_SIMD_INLINE fpack operator-(const fpack& a) { return fpack(-a.v); }
  RECO_SIMD_INLINE fpack& operator+=(const fpack& b) { v += b.v; return *this; }

  // vcmpps predicates: ordered and quiet, but "!=" (unordered: true for NaN, as in C).
  template <int Predicate, class Vector>
  static RECO_SIMD_INLINE mask_type compare(const fpack& a, const fpack& b, const Vector& comparison) {
#if RECO_SIMD_OPAQUE_MASKS
    if constexpr (uses_kmask<L>) {
      kmask16 r;
      __asm__("vcmpps %3, %2, %1, %0" : "=k"(r.v) : "v"(a.v), "v"(b.v), "i"(Predicate));
      return r;
    } else
#endif
    {
      (void)a, (void)b;
      return opaque_mask<mask_type>(comparison);
    }
  }
  friend RECO_SIMD_INLINE mask_type operator<(const fpack& a, const fpack& b) { return compare<0x11>(a, b, a.v < b.v); }
  friend RECO_SIMD_INLINE mask_type operator>(const fpack& a, const fpack& b) { return compare<0x1e>(a, b, a.v > b.v); }
  friend RECO_SIMD_INLINE mask_type operator<=(const fpack& a, const fpack& b) { return compare<0x12>(a, b, a.v <= b.v); }
  friend RECO_SIMD_INLINE mask_type operator>=(const fpack& a, const fpack& b) { return compare<0x1d>(a, b, a.v >= b.v); }
  friend RECO_SIMD_INLINE mask_type operator==(const fpack& a, const fpack& b) { return compare<0x00>(a, b, a.v == b.v); }
  friend RECO_SIMD_INLINE mask_type operator!=(const fpack& a, const fpack& b) { return compare<0x04>(a, b, a.v != b.v); }
};

template <int L>
RECO_SIMD_INLINE fpack<L> select(const fmask<L>& m, const fpack<L>& a, const fpack<L>& b) {
  typedef typename fmask<L>::raw bits;
  return fpack<L>((typename fpack<L>::raw)((m.v & (bits)a.v) | (~m.v & (bits)b.v)));
}
// m ? a : b with a mask register: one blend.
RECO_SIMD_INLINE fpack<16> select(const kmask16& m, const fpack<16>& a, const fpack<16>& b) {
#if RECO_SIMD_OPAQUE_MASKS
  typename fpack<16>::raw r;
  __asm__("vblendmps %2, %1, %0%{%3%}" : "=v"(r) : "v"(b.v), "v"(a.v), "Yk"(m.v));
  return fpack<16>(r);
#else
  fpack<16> r;
  for (int k = 0; k < 16; ++k) r.v[k] = (m.v >> k) & 1u ? a.v[k] : b.v[k];
  return r;
#endif
}
// a < b ? a : b and a > b ? a : b per lane (NaN in either gives b, as minps / maxps): one
// minps / maxps where a register of the code holds the pack (the select is a compare, a mask
// move and a blend). Through asm, so that the dispatched variants get it too (their intrinsics
// cannot be inlined into this function).
#if RECO_SIMD_OPAQUE_MASKS
#define RECO_SIMD_MINMAX_PS(op, L, a, b)                                                          \
  if constexpr (fits_register<4 * L> && (L == 16 || L == 8)) {                                 \
    typename fpack<L>::raw r;                                                                  \
    if constexpr (L == 16) __asm__(op " %2, %1, %0" : "=v"(r) : "v"(a.v), "v"(b.v));           \
    else __asm__(op " %2, %1, %0" : "=x"(r) : "x"(a.v), "x"(b.v));                              \
    return fpack<L>(r);                                                                        \
  }
#else
#define RECO_SIMD_MINMAX_PS(op, L, a, b)
#endif
template <int L>
RECO_SIMD_INLINE fpack<L> min_of(const fpack<L>& a, const fpack<L>& b) {
  RECO_SIMD_MINMAX_PS("vminps", L, a, b)
  return select(a < b, a, b);
}
template <int L>
RECO_SIMD_INLINE fpack<L> max_of(const fpack<L>& a, const fpack<L>& b) {
  RECO_SIMD_MINMAX_PS("vmaxps", L, a, b)
  return select(a > b, a, b);
}
#undef RECO_SIMD_MINMAX_PS
// acc + x, acc - x, min(x, acc) and max(x, acc) on the lanes of m, acc elsewhere (a pack's running
// sums and extremes over its selected lanes; NaN x leaves acc, as min_of / max_of): with mask
// registers one merge-masked instruction, not the operation and a blend. acc + 0 and acc - 0 are
// acc unless acc is -0, which sums started at +0 never hold, so both forms give the same bits.
#if RECO_SIMD_OPAQUE_MASKS
#define RECO_SIMD_MERGE_MASKED(instruction)                                 \
  if constexpr (std::is_same_v<typename Pk::mask_type, kmask16>) {          \
    __asm__(instruction : "+v"(acc.v) : "v"(x.v), "Yk"(m.v));               \
    return;                                                                 \
  }
#else
#define RECO_SIMD_MERGE_MASKED(instruction)
#endif
template <class Pk>
RECO_SIMD_INLINE void add_where(const typename Pk::mask_type& m, Pk& acc, const Pk& x) {
  RECO_SIMD_MERGE_MASKED("vaddps %1, %0, %0%{%2%}")
  acc += select(m, x, Pk(0.0));
}
template <class Pk>
RECO_SIMD_INLINE void sub_where(const typename Pk::mask_type& m, Pk& acc, const Pk& x) {
  RECO_SIMD_MERGE_MASKED("vsubps %1, %0, %0%{%2%}")
  acc = acc - select(m, x, Pk(0.0));
}
template <class Pk>
RECO_SIMD_INLINE void min_where(const typename Pk::mask_type& m, Pk& acc, const Pk& x) {
  RECO_SIMD_MERGE_MASKED("vminps %0, %1, %0%{%2%}")  // x < acc ? x : acc, as min_of(x, acc)
  acc = select(m, min_of(x, acc), acc);
}
template <class Pk>
RECO_SIMD_INLINE void max_where(const typename Pk::mask_type& m, Pk& acc, const Pk& x) {
  RECO_SIMD_MERGE_MASKED("vmaxps %0, %1, %0%{%2%}")
  acc = select(m, max_of(x, acc), acc);
}
#undef RECO_SIMD_MERGE_MASKED

// exp and expm1 in float, the reduction of the double ones above: x = k ln2 + r, |r| <= ln2 / 2,
// ln2 split so that k ln2_hi is exact for every |k| <= 150 the clamp lets through, expm1(r) =
// r + r^2 q(r) with q the Taylor polynomial of degree 5 (truncation below 2e-8 of p, a third of
// an ulp), 2^k as two normal factors. About 1 ulp (tested against the double functions in
// tests/core).
template <int L>
struct fexp_parts {
  fpack<L> p;          // expm1(r)
  fpack<L> k;          // the integer k, as a float
  fpack<L> excess;     // r^2 q(r) = expm1(r) - r
  fpack<L> s1, s2;     // 2^k = s1 s2, both normal numbers
  fpack<L> inv_s1;     // 1 / s1
  fpack<L> power;      // 2^k itself: a normal number only where |x| <= 64 (reduce_exp_within)
  typename fpack<L>::mask_type unreduced;  // k = 0: r is x itself
};

// The reduction of an x the caller keeps within |x| <= 64 (or NaN): no clamp of its own.
template <int L>
RECO_SIMD_INLINE fexp_parts<L> reduce_exp_within(const fpack<L>& x) {
  typedef typename fvectors<L>::u32 u32;
  const float shifter = 0x1.8p23f;
  const fpack<L> shifted = x * fpack<L>(0x1.715476p0) + fpack<L>(shifter);
  const fpack<L> k = shifted - fpack<L>(shifter);
  const fpack<L> r = (x - k * fpack<L>(0x1.63p-1)) - k * fpack<L>(-0x1.bd0106p-13);
  const fpack<L> r2 = r * r, r4 = r2 * r2;
  const fpack<L> q = (fpack<L>(1.0 / 2) + fpack<L>(1.0 / 6) * r) + (fpack<L>(1.0 / 24) + fpack<L>(1.0 / 120) * r) * r2 +
                     (fpack<L>(1.0 / 720) + fpack<L>(1.0 / 5040) * r) * r4;
  fexp_parts<L> e;
  e.excess = r2 * q;
  e.p = r + e.excess;
  e.k = k;
  e.unreduced = k == fpack<L>(0.0);
  const u32 b = (u32)shifted.v - (u32)fpack<L>(shifter).v + 254u;
  const u32 e1 = b >> 1;
  e.s1 = fpack<L>((typename fpack<L>::raw)(e1 << 23));
  e.s2 = fpack<L>((typename fpack<L>::raw)((b - e1) << 23));
  e.inv_s1 = fpack<L>((typename fpack<L>::raw)((254u - e1) << 23));
  e.power = fpack<L>((typename fpack<L>::raw)(((u32)shifted.v - (u32)fpack<L>(shifter).v + 127u) << 23));
  return e;
}
template <int L>
RECO_SIMD_INLINE fexp_parts<L> reduce_exp(const fpack<L>& input) {
  // Beyond these bounds exp is 0 or inf in float anyway (NaN passes through).
  return reduce_exp_within(min_of(fpack<L>(89.0), max_of(fpack<L>(-104.0), input)));
}
template <int L>
RECO_SIMD_INLINE fpack<L> exp_from(const fexp_parts<L>& e) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (L == 16 && fits_register<64>) {
    typename fpack<L>::raw r;
    __asm__("vscalefps %2, %1, %0" : "=v"(r) : "v"((fpack<L>(1.0) + e.p).v), "v"(e.k.v));
    return fpack<L>(r);
  }
#endif
  return (e.s1 * (fpack<L>(1.0) + e.p)) * e.s2;
}
template <int L>
RECO_SIMD_INLINE fpack<L> expm1_from(const fexp_parts<L>& e) {
  return e.s1 * (e.s2 * e.p + (e.s2 - e.inv_s1));
}
// The same for |x| <= 64, with the one factor 2^k: 2^k p + (2^k - 1) rounds as the form above
// (scaling by a power of two commutes with rounding in the normal range), the same bits.
template <int L>
RECO_SIMD_INLINE fpack<L> expm1_within_from(const fexp_parts<L>& e) {
  return e.power * e.p + (e.power - fpack<L>(1.0));
}
template <int L>
RECO_SIMD_INLINE fpack<L> exp(const fpack<L>& x) {
  return exp_from(reduce_exp(x));
}
template <int L>
RECO_SIMD_INLINE fpack<L> expm1(const fpack<L>& x) {
  return expm1_from(reduce_exp(x));
}
template <int L>
RECO_SIMD_INLINE fpack<L> exp_within(const fpack<L>& x) {
  return exp_from(reduce_exp_within(x));
}

// Loads, stores and flags of L floats, as those of doubles above; with mask registers the
// partial ones are masked loads and stores (nothing outside the first n lanes is read or
// written, and no lane goes through the stack).
template <int L>
RECO_SIMD_INLINE fpack<L> fload(const float* src) {
  typename fpack<L>::raw v;
  std::memcpy(&v, src, sizeof(v));
  return fpack<L>(v);
}
template <int L>
RECO_SIMD_INLINE typename fpack<L>::mask_type ffirst_lanes(int n) {
  if constexpr (uses_kmask<L>) {
#if RECO_SIMD_OPAQUE_MASKS
    kmask16 m;
    __asm__("kmovw %1, %0" : "=k"(m.v) : "r"((1u << n) - 1u));
    return m;
#endif
  } else {
    typename fmask<L>::raw iota{};
    for (int k = 0; k < L; ++k) iota[k] = k;
    return opaque_mask<fmask<L>>(iota < n);
  }
}
template <int L>
RECO_SIMD_INLINE fpack<L> fload_first(const float* src, int n) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (uses_kmask<L>) {
    typename fpack<L>::raw v;
    __asm__("vmovups %1, %0%{%2%}%{z%}" : "=v"(v) : "m"(*reinterpret_cast<const float(*)[16]>(src)),
                                                   "Yk"(ffirst_lanes<L>(n).v));
    return fpack<L>(v);
  }
#endif
  float buf[L] = {};
  for (int k = 0; k < n; ++k) buf[k] = src[k];
  return fload<L>(buf);
}
template <int L>
RECO_SIMD_INLINE void fstore(float* dst, const fpack<L>& x) {
  std::memcpy(dst, &x.v, sizeof(x.v));
}
template <int L>
RECO_SIMD_INLINE void fstore_first(float* dst, const fpack<L>& x, int n) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (uses_kmask<L>) {
    __asm__("vmovups %1, %0%{%2%}" : "+m"(*reinterpret_cast<float(*)[16]>(dst)) : "v"(x.v), "Yk"(ffirst_lanes<L>(n).v));
    return;
  }
#endif
  float buf[L];
  fstore<L>(buf, x);
  for (int k = 0; k < n; ++k) dst[k] = buf[k];
}
// Nonzero bytes as lanes. x86: a byte compare and its movemask give one bit per byte, which
// each lane tests (g++ 12 turns __builtin_convertvector of the bytes into an extraction and an
// insert per lane, and a shuffle of them into a round trip through the stack); with mask
// registers one vptestmb of the 16 bytes.
template <int L>
RECO_SIMD_INLINE fmask<L> fload_vector_flags(const std::uint8_t* src);
template <int L>
RECO_SIMD_INLINE typename fpack<L>::mask_type fload_flags(const std::uint8_t* src) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (uses_kmask<L>) {
    typedef std::uint8_t bytes __attribute__((vector_size(16)));
    bytes v;
    std::memcpy(&v, src, sizeof(v));
    kmask16 m;
    __asm__("vptestmb %1, %1, %0" : "=k"(m.v) : "v"(v));
    return m;
  } else
#endif
  {
    return fload_vector_flags<L>(src);
  }
}
template <int L>
RECO_SIMD_INLINE fmask<L> fload_vector_flags(const std::uint8_t* src) {
#if defined(__SSE2__)
  typedef typename fvectors<L>::u32 u32;
  __m128i v;
  if constexpr (L == 16) {
    v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  } else if constexpr (L == 8) {
    v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
  } else {
    std::int32_t word;
    std::memcpy(&word, src, sizeof(word));
    v = _mm_cvtsi32_si128(word);
  }
  const std::uint32_t zero = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())));
  u32 bit;
  for (int k = 0; k < L; ++k) bit[k] = 1u << k;
  return opaque_mask<fmask<L>>(((u32{} + zero) & bit) == 0);
#else
  typedef typename fmask<L>::raw i32;
  typename fvectors<L>::u8 v;
  std::memcpy(&v, src, sizeof(v));
  return fmask<L>((i32)(__builtin_convertvector(v, i32) != 0));
#endif
}
template <int L>
RECO_SIMD_INLINE typename fpack<L>::mask_type fload_first_flags(const std::uint8_t* src, int n) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (uses_kmask<L>) {
    typedef std::uint8_t bytes __attribute__((vector_size(16)));
    bytes v;
    kmask16 m;
    __asm__("vmovdqu8 %1, %0%{%2%}%{z%}" : "=v"(v) : "m"(*reinterpret_cast<const std::uint8_t(*)[16]>(src)),
                                                    "Yk"(ffirst_lanes<L>(n).v));
    __asm__("vptestmb %1, %1, %0" : "=k"(m.v) : "v"(v));
    return m;
  }
#endif
  std::uint8_t buf[L] = {};
  for (int k = 0; k < n; ++k) buf[k] = src[k];
  return fload_flags<L>(buf);
}
template <int L, bool Full>
RECO_SIMD_INLINE typename fpack<L>::mask_type fvalid_lanes(const std::uint8_t* flags, int n) {
  using M = typename fpack<L>::mask_type;
  if (!flags) return Full ? M(true) : ffirst_lanes<L>(n);
  return Full ? fload_flags<L>(flags) : fload_first_flags<L>(flags, n);
}
template <int L>
RECO_SIMD_INLINE bool any(const fmask<L>& m) {
  std::int32_t bits = 0;
  for (int k = 0; k < L; ++k) bits |= m.v[k];
  return bits != 0;
}
RECO_SIMD_INLINE bool any(const kmask16& m) { return m.bits() != 0; }
template <int L>
RECO_SIMD_INLINE double min_lanes(const fpack<L>& x) {
  float s = x.v[0];
  for (int k = 1; k < L; ++k) s = x.v[k] < s ? x.v[k] : s;
  return s;
}
template <int L>
RECO_SIMD_INLINE double max_lanes(const fpack<L>& x) {
  float s = x.v[0];
  for (int k = 1; k < L; ++k) s = x.v[k] > s ? x.v[k] : s;
  return s;
}

// Half h (0: lanes [0, W), 1: [W, 2W)) of a float pack, widened to doubles (exact).
template <int W>
RECO_SIMD_INLINE pack<W> widen_half(const fpack<2 * W>& x, int h) {
  typedef typename vectors<W>::f32 half;
  half v;
  if constexpr (W == 8) {
    v = h == 0 ? __builtin_shufflevector(x.v, x.v, 0, 1, 2, 3, 4, 5, 6, 7)
               : __builtin_shufflevector(x.v, x.v, 8, 9, 10, 11, 12, 13, 14, 15);
  } else if constexpr (W == 4) {
    v = h == 0 ? __builtin_shufflevector(x.v, x.v, 0, 1, 2, 3) : __builtin_shufflevector(x.v, x.v, 4, 5, 6, 7);
  } else {
    static_assert(W == 2, "2, 4 or 8 doubles per pack");
    v = h == 0 ? __builtin_shufflevector(x.v, x.v, 0, 1) : __builtin_shufflevector(x.v, x.v, 2, 3);
  }
  return pack<W>(__builtin_convertvector(v, typename pack<W>::raw));
}
// acc += x lane by lane: a double pack as it is; a float pack as the sums of its two halves'
// lanes, in double (lane k of acc takes lanes k and W + k), so that the sum leaves float at once.
template <int W>
RECO_SIMD_INLINE void accumulate(pack<W>& acc, const pack<W>& x) {
  acc += x;
}
template <int W>
RECO_SIMD_INLINE void accumulate(pack<W>& acc, const fpack<2 * W>& x) {
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (W == 8 && fits_register<64>) {
    // g++ 12 widens 8 floats as two 4-float halves and an insert: two conversions, an extract
    // and an insert per half. One 512-bit conversion per half here (pack<8> only exists in
    // AVX-512 code).
    typename pack<W>::raw lo, hi;
    __asm__("vcvtps2pd %t2, %0\n\tvextractf32x8 $1, %2, %t1\n\tvcvtps2pd %t1, %1" : "=&v"(lo), "=&v"(hi) : "v"(x.v));
    acc += pack<W>(lo) + pack<W>(hi);
    return;
  }
#endif
  acc += widen_half<W>(x, 0) + widen_half<W>(x, 1);
}

// The nonzero bytes among n at p (the valid tokens of a mask): 8 bytes per word by a carry-free
// byte test; AVX-512 code tests 64 bytes with one vptestmb into a mask register, asking for the
// line 4 KiB ahead (a response's mask is a short stream the hardware prefetcher joins late).
template <int W>
RECO_SIMD_INLINE std::int64_t nonzero_bytes(const std::uint8_t* p, std::int64_t n) {
  std::int64_t count = 0, i = 0;
#if RECO_SIMD_OPAQUE_MASKS
  if constexpr (W == 8 && float_kmasks) {
    typedef std::uint8_t bytes __attribute__((vector_size(64)));
    for (; i + 64 <= n; i += 64) {
      __builtin_prefetch(p + i + 4096);
      bytes v;
      std::memcpy(&v, p + i, sizeof(v));
      std::uint64_t k, bits;
      __asm__("vptestmb %1, %1, %0" : "=k"(k) : "v"(v));
      __asm__("kmovq %1, %0" : "=r"(bits) : "k"(k));
      count += __builtin_popcountll(bits);
    }
  }
#endif
  constexpr std::uint64_t low7 = 0x7f7f7f7f7f7f7f7full;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, sizeof(w));
    count += __builtin_popcountll((((w & low7) + low7) | w) & ~low7);
  }
  for (; i < n; ++i) count += p[i] != 0;
  return count;
}

// The log-probability check (finite and <= 0) on many packs at two integer instructions each and
// no mask: the largest bits of the lanes as signed and as unsigned integers. As signed integers +0
// is 0, the values with the sign bit set (-0 to -inf, NaN so signed) lie below it, and positive
// values, +inf and NaN without the sign above; as unsigned, +0 and [-max, -0] lie at or below the
// bits of -max, -inf and NaN with the sign above. So some lane failed exactly when the signed
// maximum exceeds 0 or the unsigned one the bits of -max.
// I, U: the signed and unsigned integer vectors of the pack's lanes; Lowest: the bits of -max.
template <class I, class U, int Lanes, std::uint64_t Lowest>
struct bits_max_check {
  using E = std::decay_t<decltype(std::declval<U&>()[0])>;
  I top_signed = I{};
  U top_unsigned = U{};
  template <class Raw>
  RECO_SIMD_INLINE void add_bits(const Raw& v) {
    const I s = (I)v;
    const U u = (U)v;
    top_signed = top_signed > s ? top_signed : s;
    top_unsigned = top_unsigned > u ? top_unsigned : u;
  }
  RECO_SIMD_INLINE bool failed() const {
    bool f = false;
    for (int k = 0; k < Lanes; ++k) f = f || top_signed[k] > 0 || top_unsigned[k] > static_cast<E>(Lowest);
    return f;
  }
};
template <class P>
struct log_probability_keys;
template <int L>
struct log_probability_keys<fpack<L>>
    : bits_max_check<typename fvectors<L>::i32, typename fvectors<L>::u32, L, 0xff7fffffu> {  // -FLT_MAX
  RECO_SIMD_INLINE void add(const fpack<L>& x) { this->add_bits(x.v); }
};
template <int W>
struct log_probability_keys<pack<W>>
    : bits_max_check<typename vectors<W>::i64, typename vectors<W>::u64, W, 0xffefffffffffffffull> {  // -DBL_MAX
  RECO_SIMD_INLINE void add(const pack<W>& x) { this->add_bits(x.v); }
};

// acc += x * scale lane by lane, in double (the float pack's two halves summed first).
template <int W>
RECO_SIMD_INLINE void accumulate_scaled(pack<W>& acc, const fpack<2 * W>& x, double scale) {
  pack<W> sum(0.0);
  accumulate(sum, x);
  acc += sum * pack<W>(scale);
}

// The pack a token pass computes on at W doubles per register: W doubles for double inputs,
// 2W floats for float inputs (the precision policy, docs/conventions.md), with its loads and
// stores of T.
template <class T, int W>
struct token_io;
template <int W>
struct token_io<double, W> {
  using P = simd::pack<W>;
  using M = simd::mask<W>;
  static constexpr int L = W;
  template <bool Full>
  static RECO_SIMD_INLINE P load(const double* src, int n) {
    if constexpr (Full) return simd::load<W>(src);
    else return simd::load_first<W>(src, n);
  }
  template <bool Full>
  static RECO_SIMD_INLINE M flags(const std::uint8_t* src, int n) {
    if constexpr (Full) return simd::load_flags<W>(src);
    else return simd::load_first_flags<W>(src, n);
  }
  template <bool Full>
  static RECO_SIMD_INLINE M valid(const std::uint8_t* mask, int n) {
    return simd::valid_lanes<W, Full>(mask, n);
  }
  static RECO_SIMD_INLINE M first_lanes(int n) { return simd::first_lanes<W>(n); }
  template <bool Full>
  static RECO_SIMD_INLINE void store(double* dst, const P& x, int n) {
    if constexpr (Full) simd::store<W>(dst, x);
    else simd::store_first<W>(dst, x, n);
  }
};
template <int W>
struct token_io<float, W> {
  static constexpr int L = 2 * W;
  using P = simd::fpack<L>;
  using M = typename P::mask_type;
  template <bool Full>
  static RECO_SIMD_INLINE P load(const float* src, int n) {
    if constexpr (Full) return simd::fload<L>(src);
    else return simd::fload_first<L>(src, n);
  }
  template <bool Full>
  static RECO_SIMD_INLINE M flags(const std::uint8_t* src, int n) {
    if constexpr (Full) return simd::fload_flags<L>(src);
    else return simd::fload_first_flags<L>(src, n);
  }
  template <bool Full>
  static RECO_SIMD_INLINE M valid(const std::uint8_t* mask, int n) {
    return simd::fvalid_lanes<L, Full>(mask, n);
  }
  static RECO_SIMD_INLINE M first_lanes(int n) { return simd::ffirst_lanes<L>(n); }
  template <bool Full>
  static RECO_SIMD_INLINE void store(float* dst, const P& x, int n) {
    if constexpr (Full) simd::fstore<L>(dst, x);
    else simd::fstore_first<L>(dst, x, n);
  }
};

// ---- dispatch ----------------------------------------------------------------------------------
//
// run_widest<K>(args...) calls K::run<W>(args...) with the widest W this process runs: the
// compile-time width, or (RECO_SIMD_DISPATCH) a variant of the same template compiled for AVX2 or
// AVX-512 (a target attribute, with everything below it inlined into it).
#if RECO_SIMD_DISPATCH_AVX512
template <class K, class... A>
RECO_SIMD_TARGET_AVX512 void run_avx512(A&... a) {
  K::template run<8>(a...);
}
#endif
#if RECO_SIMD_DISPATCH_AVX2
template <class K, class... A>
RECO_SIMD_TARGET_AVX2 void run_avx2(A&... a) {
  K::template run<4>(a...);
}
#endif

template <class K, class... A>
inline void run_widest(A&... a) {
#if RECO_SIMD_DISPATCH
  switch (dispatch()) {
#if RECO_SIMD_DISPATCH_AVX512
    case level::avx512: run_avx512<K>(a...); return;
#endif
#if RECO_SIMD_DISPATCH_AVX2
    case level::avx2: run_avx2<K>(a...); return;
#endif
    default: break;
  }
#endif
  K::template run<width>(a...);
}

}  // namespace simd

namespace detail {

// What lets the components' math (written over V) run on a pack.
template <int W>
struct lanes<simd::pack<W>> {
  using pack = simd::pack<W>;
  using mask = simd::mask<W>;
  static RECO_SIMD_INLINE pack select(const mask& m, const pack& a, const pack& b) { return simd::select(m, a, b); }
  static RECO_SIMD_INLINE pack min(const pack& a, const pack& b) { return simd::min_of(b, a); }  // b < a ? b : a
  static RECO_SIMD_INLINE pack max(const pack& a, const pack& b) { return simd::max_of(b, a); }  // b > a ? b : a
  static RECO_SIMD_INLINE bool any(const mask& m) { return simd::any(m); }
  static RECO_SIMD_INLINE pack exp(const pack& x) { return simd::exp(x); }
  static RECO_SIMD_INLINE pack exp_within(const pack& x) { return simd::exp_within(x); }
  static RECO_SIMD_INLINE pack expm1(const pack& x) { return simd::expm1(x); }
  // Lane by lane through the C library (only DPPO's binary-KL region needs a log).
  static RECO_SIMD_INLINE pack log(const pack& x) {
    double v[W];
    simd::store<W>(v, x);
    for (int k = 0; k < W; ++k) v[k] = ::log(v[k]);
    return simd::load<W>(v);
  }
  // As lanes<double>::bernoulli_variance, with exp and expm1 from one range reduction.
  static RECO_SIMD_INLINE pack bernoulli_variance(const pack& logq, double floor) {
    const simd::exp_parts<W> e = simd::reduce_exp(logq);
    const pack q = simd::exp_from(e);
    const pack one_minus_q = simd::select(q < 0.5, 1.0 - q, -simd::expm1_from(e));
    const pack v = q * one_minus_q;
    return simd::max_of(v, pack(floor));  // v > floor ? v : floor
  }
  static RECO_SIMD_INLINE pack expm1_excess(const pack& x, pack& em1) {
    em1 = simd::expm1(x);
    return em1 - x;
  }
  static RECO_SIMD_INLINE pack expm1_excess_within(const pack& x, pack& em1) { return expm1_excess(x, em1); }
  static constexpr bool single_precision = false;
};

// The same on packs of floats (the token pass of float inputs).
template <int L>
struct lanes<simd::fpack<L>> {
  using pack = simd::fpack<L>;
  using mask = typename pack::mask_type;
  static RECO_SIMD_INLINE pack select(const mask& m, const pack& a, const pack& b) { return simd::select(m, a, b); }
  static RECO_SIMD_INLINE pack add_selected(const mask& m, const pack& acc, const pack& x) {
    pack r = acc;
    simd::add_where(m, r, x);
    return r;
  }
  static RECO_SIMD_INLINE pack min(const pack& a, const pack& b) { return simd::min_of(b, a); }
  static RECO_SIMD_INLINE pack max(const pack& a, const pack& b) { return simd::max_of(b, a); }
  static RECO_SIMD_INLINE bool any(const mask& m) { return simd::any(m); }
  static RECO_SIMD_INLINE pack exp(const pack& x) { return simd::exp(x); }
  static RECO_SIMD_INLINE pack exp_within(const pack& x) { return simd::exp_within(x); }
  static RECO_SIMD_INLINE pack expm1(const pack& x) { return simd::expm1(x); }
  static RECO_SIMD_INLINE pack log(const pack& x) {
    float v[L];
    simd::fstore<L>(v, x);
    for (int k = 0; k < L; ++k) v[k] = ::logf(v[k]);
    return simd::fload<L>(v);
  }
  // The floor is at least the smallest normal float (2^-126): below it q (1 - q) is a subnormal
  // with fewer significant bits, so the floor decides there.
  // A log-probability is at most 0 (the pass checks it), so of exp's range clamp only the lower
  // bound can bite.
  static RECO_SIMD_INLINE pack bernoulli_variance(const pack& logq, double floor) {
    const simd::fexp_parts<L> e = simd::reduce_exp_within(simd::max_of(pack(-104.0), logq));
    const pack q = simd::exp_from(e);
    const double f = floor > 0x1p-126 ? floor : 0x1p-126;
#if RECO_SIMD_OPAQUE_MASKS
    if constexpr (simd::uses_kmask<L>) {
      // 1 - q = -expm1(logq) = (1 - 2^k) - 2^k p, 2^k by a scalef and the product exact in the
      // fused multiply-add: k <= 0, so 2^k never overflows, and -expm1 is within 3u of 1 - q at
      // every q (no cancellation as q -> 1; 1 - q >= 0.29 where k < 0), so no select between the
      // two forms.
      typename pack::raw power;
      __asm__("vscalefps %2, %1, %0" : "=v"(power) : "v"(pack(1.0).v), "v"(e.k.v));
      const pack one_minus_q = (pack(1.0) - pack(power)) - pack(power) * e.p;
      return simd::max_of(q * one_minus_q, pack(f));
    }
#endif
    const pack one_minus_q = simd::select(q < 0.5, 1.0 - q, -simd::expm1_from(e));
    const pack v = q * one_minus_q;
    return simd::max_of(v, pack(f));
  }
  // expm1(x) - x without the cancellation: r^2 q(r) itself where the reduction left x as it is
  // (|x| < ln2 / 2); beyond, expm1(x) and x differ by at least a tenth of |x|.
  static RECO_SIMD_INLINE pack expm1_excess(const pack& x, pack& em1) {
    const simd::fexp_parts<L> e = simd::reduce_exp(x);
    em1 = simd::expm1_from(e);
    return simd::select(e.unreduced, e.excess, em1 - x);
  }
  // The same for |x| <= 64 (a caller's clamp): no range clamp, 2^k as one factor.
  static RECO_SIMD_INLINE pack expm1_excess_within(const pack& x, pack& em1) {
    const simd::fexp_parts<L> e = simd::reduce_exp_within(x);
    em1 = simd::expm1_within_from(e);
    return simd::select(e.unreduced, e.excess, em1 - x);
  }
#if RECO_SIMD_OPAQUE_MASKS
  // The valid lanes whose value is not a log-probability (NaN, +-inf or above 0), from the
  // bits: as signed integers the floats in [-FLT_MAX, -0] lie at or below the bits of -FLT_MAX,
  // +0 is 0 and everything else lies above; two compares into mask registers, no float test.
  template <int N = L, std::enable_if_t<simd::uses_kmask<N>, int> = 0>
  static RECO_SIMD_INLINE mask bad_log_probability(const mask& valid, const pack& x) {
    typedef typename simd::fvectors<L>::i32 i32;
    const i32 bits = (i32)x.v;
    const i32 lowest = i32{} - 8388609;  // 0xff7fffff: -FLT_MAX
    simd::kmask16 above, nonzero;
    __asm__("vpcmpd $6, %2, %1, %0%{%3%}" : "=k"(above.v) : "v"(bits), "v"(lowest), "Yk"(valid.v));
    __asm__("vptestmd %1, %1, %0%{%2%}" : "=k"(nonzero.v) : "v"(bits), "Yk"(above.v));
    return nonzero;
  }
#endif
  static constexpr bool single_precision = true;
};

}  // namespace detail
RECO_NAMESPACE_END

#pragma GCC diagnostic pop

#endif  // RECO_SIMD

RECO_NAMESPACE_BEGIN
namespace simd {
// A scalar kernel written as plain loops (K::run<W>, W unused), run through run_widest where the
// packs exist, so that the compiler vectorises its loops for the widest instruction set the
// process runs; compiled once for the unit's flags otherwise.
template <class K, class... A>
inline void run_widest_loops(A&... a) {
#if RECO_SIMD
  run_widest<K>(a...);
#else
  K::template run<1>(a...);
#endif
}
}  // namespace simd
RECO_NAMESPACE_END
