// reco::bf16_t and reco::f16_t: 16-bit floating-point *storage* types. Each is exactly one
// std::uint16_t holding the IEEE bit pattern, so a buffer of at::BFloat16 / __nv_bfloat16
// (bf16: 1 sign, 8 exponent, 7 mantissa bits) or at::Half / __half (fp16: 1, 5, 10) can be
// reinterpret_cast to bf16_t* / f16_t* without a copy. No arithmetic is defined on them: the
// kernels widen to float, compute, and narrow once on the way out.
//
//   float f = static_cast<float>(x);   // exact widening
//   reco::bf16_t b(1.5f);              // narrowing rounds to nearest, ties to even
//   reco::bf16_t c = reco::bf16_t::from_bits(0x3fc0);
//
// Host and device conversions give identical results (the device uses the CUDA intrinsics, the
// host the bit-level equivalents below); NaN stays NaN, overflow rounds to infinity.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reco/config.hpp"

#if RECO_DEVICE_COMPILER
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

RECO_NAMESPACE_BEGIN

namespace detail {

RECO_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if RECO_IN_DEVICE_CODE
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

RECO_HOST_DEVICE inline float float_from_bits(std::uint32_t u) {
#if RECO_IN_DEVICE_CODE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float -> bf16 bits, round to nearest even: adding 0x7fff plus the lowest kept bit carries into
// the kept part exactly when the dropped half is above the midpoint (or at it with an odd kept
// part). NaN is selected separately because the carry could turn it into infinity. Written with
// integer selects only, so that loops over it vectorise.
inline std::uint16_t bf16_bits_from_float_host(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// fp16 bits -> float. Shifting the 15 exponent+mantissa bits into float position and multiplying
// by 2^112 rebiases the exponent (127 - 15 = 112) and normalises subnormals in one float multiply;
// an fp16 exponent of 31 (inf/NaN) lands at exactly 2^16 or above and is restored to 255.
inline float float_from_f16_bits_host(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  float f = float_from_bits(magnitude) * 0x1p112f;
  std::uint32_t u = float_bits(f);
  if (f >= 65536.0f) u |= 0x7f800000u;
  return float_from_bits(u | sign);
}

// float -> fp16 bits, round to nearest even. The three cases are all computed, then selected:
//   |f| < 2^-14, an fp16 subnormal or zero: adding 0.5 leaves a float whose last mantissa bit is
//     worth 2^-24, the fp16 subnormal step, so the FPU does the rounding to nearest even; the
//     mantissa bits are then the fp16 encoding (0x400 = rounded up to the smallest normal);
//   normal range: rebias the exponent (-112 << 23) and round the 13 dropped bits to even; a carry
//     out of the mantissa correctly bumps the exponent (up to infinity from 65520 on);
//   |f| >= 65536, infinity or NaN: infinity, or a quiet NaN.
inline std::uint16_t f16_bits_from_float_host(float f) {
  const std::uint32_t bits = float_bits(f);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t u = bits & 0x7fffffffu;
  const std::uint32_t subnormal = float_bits(float_from_bits(u) + 0.5f) - 0x3f000000u;
  const std::uint32_t normal = (u + (static_cast<std::uint32_t>(-112) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  const std::uint32_t special = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  std::uint32_t h = u < 0x38800000u ? subnormal : normal;
  h = u >= 0x47800000u ? special : h;
  return static_cast<std::uint16_t>(h | sign);
}

}  // namespace detail

struct bf16_t {
  std::uint16_t bits;

  bf16_t() = default;
  RECO_HOST_DEVICE explicit bf16_t(float f) : bits(from_float(f)) {}
  RECO_HOST_DEVICE static constexpr bf16_t from_bits(std::uint16_t b) {
    bf16_t x{};
    x.bits = b;
    return x;
  }
  // Widening is exact: bf16 is the top half of a float.
  RECO_HOST_DEVICE operator float() const { return detail::float_from_bits(static_cast<std::uint32_t>(bits) << 16); }

 private:
  RECO_HOST_DEVICE static std::uint16_t from_float(float f) {
#if RECO_IN_DEVICE_CODE
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    return detail::bf16_bits_from_float_host(f);
#endif
  }
};

struct f16_t {
  std::uint16_t bits;

  f16_t() = default;
  RECO_HOST_DEVICE explicit f16_t(float f) : bits(from_float(f)) {}
  RECO_HOST_DEVICE static constexpr f16_t from_bits(std::uint16_t b) {
    f16_t x{};
    x.bits = b;
    return x;
  }
  RECO_HOST_DEVICE operator float() const {
#if RECO_IN_DEVICE_CODE
    return __half2float(__ushort_as_half(bits));
#else
    return detail::float_from_f16_bits_host(bits);
#endif
  }

 private:
  RECO_HOST_DEVICE static std::uint16_t from_float(float f) {
#if RECO_IN_DEVICE_CODE
    return __half_as_ushort(__float2half_rn(f));
#else
    return detail::f16_bits_from_float_host(f);
#endif
  }
};

// The layout promise that makes reinterpret_cast from the framework types sound.
static_assert(sizeof(bf16_t) == 2 && alignof(bf16_t) == 2, "bf16_t must be a bare 16-bit word");
static_assert(sizeof(f16_t) == 2 && alignof(f16_t) == 2, "f16_t must be a bare 16-bit word");
static_assert(std::is_trivially_copyable_v<bf16_t> && std::is_standard_layout_v<bf16_t>, "bf16_t layout");
static_assert(std::is_trivially_copyable_v<f16_t> && std::is_standard_layout_v<f16_t>, "f16_t layout");

RECO_NAMESPACE_END
