// dtype conversions against known bit patterns: round to nearest even, NaN, inf, subnormals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/dtype.h"
#include "common/error.h"

namespace lfm2 {
namespace {

float f(uint32_t bits) { return bits_to_float(bits); }

TEST(Bf16, KnownPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(f(0x3f808000)), 0x3f80);  // halfway, even below: down
  EXPECT_EQ(float_to_bf16(f(0x3f818000)), 0x3f82);  // halfway, odd below: up
  EXPECT_EQ(float_to_bf16(f(0x3f808001)), 0x3f81);  // above halfway: up
  EXPECT_EQ(float_to_bf16(f(0x3f807fff)), 0x3f80);  // below halfway: down
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(f(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds up to inf
  EXPECT_EQ(float_to_bf16(f(0x7f7f7fff)), 0x7f7f);  // largest that stays finite
  EXPECT_EQ(float_to_bf16(f(0x00008000)), 0x0000);  // subnormal halfway, even: down
  EXPECT_EQ(float_to_bf16(f(0x00018000)), 0x0002);  // subnormal halfway, odd: up
  EXPECT_EQ(float_to_bf16(f(0x00010000)), 0x0001);  // smallest bf16 subnormal exact
  // NaN stays NaN (quiet), sign kept, even when the payload sits in the low bits only.
  EXPECT_EQ(float_to_bf16(f(0x7fc00000)), 0x7fc0);
  EXPECT_EQ(float_to_bf16(f(0xffc00000)), 0xffc0);
  const uint16_t low_payload = float_to_bf16(f(0x7f800001));
  EXPECT_EQ(low_payload & 0x7f80, 0x7f80);
  EXPECT_NE(low_payload & 0x007f, 0);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bits(bf16_to_float(0x0001)), 0x00010000u);
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = bf16_to_float(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(v))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(v), h) << std::hex << h;
  }
}

TEST(Fp16, KnownPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // halfway to 65536: rounds to even = inf
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway, even: down
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway, odd: up
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);             // smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);             // halfway to it: even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);             // 1.5 ulp: up to 2
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff);          // largest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);          // rounds up into the normals
  EXPECT_EQ(float_to_fp16(std::nanf("")) & 0x7e00, 0x7e00);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e00)));
}

TEST(Fp16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = fp16_to_float(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(v))));
      continue;
    }
    ASSERT_EQ(float_to_fp16(v), h) << std::hex << h;
  }
}

TEST(ConvertElements, BetweenAllDtypes) {
  const float src[4] = {1.0f, -0.5f, 3.140625f, 65504.0f};
  uint16_t bf[4], hf[4];
  float back[4];
  convert_elements(bf, DType::BF16, src, DType::F32, 4);
  convert_elements(hf, DType::F16, bf, DType::BF16, 4);
  convert_elements(back, DType::F32, hf, DType::F16, 4);
  EXPECT_EQ(bf[0], 0x3f80);
  EXPECT_EQ(bf[2], 0x4049);  // 3.140625 exact in bf16
  EXPECT_EQ(bf[3], 0x4780);  // 65504 -> 65536 in bf16
  EXPECT_EQ(hf[3], 0x7c00);  // 65536 overflows fp16
  EXPECT_EQ(back[1], -0.5f);
  EXPECT_EQ(back[2], 3.140625f);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_THROW(parse_dtype("int8"), Error);
}

}  // namespace
}  // namespace lfm2
