// reco::bf16_t / reco::f16_t: exact widening, round-to-nearest-even narrowing, specials.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "reco/logits/half_types.hpp"

namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even onto the values of a 16-bit format, by brute force from the exact
// widening: the candidates are the two neighbours in the same sign, compared in double.
template <class H>
bool is_correctly_rounded(float f, H h) {
  const double exact = f;
  const double got = static_cast<float>(h);
  if (std::isnan(exact)) return std::isnan(got);
  for (int delta : {-1, 1}) {
    const std::uint16_t nb = static_cast<std::uint16_t>(h.bits + delta);
    if ((nb & 0x7fff) == 0x7fff || ((nb ^ h.bits) & 0x8000)) continue;  // wrapped past sign or NaN
    const double other = static_cast<float>(H::from_bits(nb));
    if (std::isnan(other)) continue;
    const double e_got = std::fabs(got - exact), e_other = std::fabs(other - exact);
    if (std::isinf(got) && !std::isinf(exact)) {
      // Overflow: only correct when exact is at least halfway past the largest finite value.
      if (std::isinf(other) || std::fabs(exact) < std::fabs(other)) return false;
      const double ulp_top = std::fabs(other) - std::fabs(static_cast<float>(H::from_bits(static_cast<std::uint16_t>(nb - 1))));
      if (std::fabs(exact) < std::fabs(other) + ulp_top / 2) return false;
      continue;
    }
    if (std::isinf(other)) continue;
    if (e_other < e_got) return false;
    if (e_other == e_got && (h.bits & 1)) return false;  // a tie must go to the even pattern
  }
  return true;
}

TEST(HalfTypes, LayoutIsABareWord) {
  static_assert(sizeof(reco::bf16_t) == 2 && sizeof(reco::f16_t) == 2);
  EXPECT_EQ(reco::bf16_t(1.0f).bits, 0x3f80);
  EXPECT_EQ(reco::f16_t(1.0f).bits, 0x3c00);
  EXPECT_EQ(reco::f16_t(-2.0f).bits, 0xc000);
}

TEST(HalfTypes, WideningIsExactAndNarrowingInvertsIt) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto hb = static_cast<std::uint16_t>(b);
    const float f16 = reco::f16_t::from_bits(hb), bf = reco::bf16_t::from_bits(hb);
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(reco::f16_t(f16))));
    } else {
      ASSERT_EQ(reco::f16_t(f16).bits, hb) << std::hex << b;
    }
    if (std::isnan(bf)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(reco::bf16_t(bf))));
    } else {
      ASSERT_EQ(reco::bf16_t(bf).bits, hb) << std::hex << b;
    }
  }
  // A few decoded values.
  EXPECT_EQ(static_cast<float>(reco::f16_t::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(static_cast<float>(reco::f16_t::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(reco::f16_t::from_bits(0x0400)), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(static_cast<float>(reco::f16_t::from_bits(0xfc00))));
  EXPECT_EQ(static_cast<float>(reco::bf16_t::from_bits(0xc2fe)), -127.0f);
}

TEST(HalfTypes, RoundsToNearestEvenAtTheEdges) {
  // fp16: ties to even, subnormal rounding, overflow at 65520.
  EXPECT_EQ(reco::f16_t(65504.0f).bits, 0x7bff);
  EXPECT_EQ(reco::f16_t(65519.99f).bits, 0x7bff);
  EXPECT_EQ(reco::f16_t(65520.0f).bits, 0x7c00);
  EXPECT_EQ(reco::f16_t(1e9f).bits, 0x7c00);
  EXPECT_EQ(reco::f16_t(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(reco::f16_t(std::ldexp(1.0f, -25)).bits, 0x0000);      // tie between 0 and 2^-24: even
  EXPECT_EQ(reco::f16_t(3 * std::ldexp(1.0f, -25)).bits, 0x0002);  // tie between 1 and 2 ulps: even
  EXPECT_EQ(reco::f16_t(std::ldexp(1.0f, -26)).bits, 0x0000);
  EXPECT_EQ(reco::f16_t(-std::ldexp(1.0f, -30)).bits, 0x8000);  // sign of zero kept
  EXPECT_EQ(reco::f16_t(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie, even stays
  EXPECT_EQ(reco::f16_t(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(static_cast<float>(reco::f16_t(std::numeric_limits<float>::quiet_NaN()))));
  // bf16.
  EXPECT_EQ(reco::bf16_t(bits_to_float(0x3f808000)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(reco::bf16_t(bits_to_float(0x3f818000)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(reco::bf16_t(bits_to_float(0x3f808001)).bits, 0x3f81);
  EXPECT_EQ(reco::bf16_t(bits_to_float(0x7f7fffff)).bits, 0x7f80);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(static_cast<float>(reco::bf16_t(bits_to_float(0x7f800001)))));  // NaN stays NaN
}

TEST(HalfTypes, RandomFloatsAreCorrectlyRounded) {
  std::mt19937 rng(4);
  for (int i = 0; i < 200000; ++i) {
    // Every other sample has an exponent near the fp16 range (2^-30 .. 2^17), the rest any.
    std::uint32_t u = static_cast<std::uint32_t>(rng());
    if (i % 2) u = (u & 0x807fffffu) | ((97u + u % 48u) << 23);
    const float f = bits_to_float(u);
    if (std::isnan(f)) continue;
    const reco::f16_t h(f);
    const reco::bf16_t b(f);
    ASSERT_TRUE(is_correctly_rounded(f, b)) << f;
    if (std::fabs(f) < 1e6f) {
      ASSERT_TRUE(is_correctly_rounded(f, h)) << f;
    }
#if defined(__FLT16_MAX__)
    // The compiler's own conversion, where it has one.
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(h.bits, ref_bits) << f;
#endif
  }
}

}  // namespace
