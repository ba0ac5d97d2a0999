#include "common/fp8.h"

#include <algorithm>
#include <cmath>

#include "common/dtype.h"
#include "common/error.h"

namespace lfm2 {

const char* fp8_scheme_name(Fp8Scheme s) { return s == Fp8Scheme::Channel ? "channel" : "block128"; }

Fp8Scheme parse_fp8_scheme(const std::string& s) {
  if (s == "channel") return Fp8Scheme::Channel;
  if (s == "block128") return Fp8Scheme::Block128;
  throw Error(cat("unknown fp8 scheme '", s, "' (expected channel or block128)"));
}

float e4m3_to_float(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m), -9);  // subnormal: m * 2^-9
  return sign * std::ldexp(float(8 + m), e - 10);      // (1 + m/8) * 2^(e-7)
}

uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);  // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7e);  // >= 448 (inf included): saturate
  if (a < 0x3c800000u) {                              // below 2^-6: subnormal steps of 2^-9
    const float r = std::nearbyint(bits_to_float(a) * 512.0f);  // exact scaling, RNE
    return uint8_t(sign | uint8_t(r));                // r = 8 is 2^-6: the encoding 0x08, correct
  }
  const uint32_t e = (a >> 23) - 120;  // rebias 127 -> 7
  const uint32_t m = a & 0x7fffffu;
  uint32_t c = (e << 3) | (m >> 20);
  const uint32_t rest = m & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (c & 1u))) ++c;  // may carry into the exponent
  return uint8_t(sign | std::min<uint32_t>(c, 0x7e));         // 464 and up were caught above
}

int64_t fp8_scale_rows(Fp8Scheme s, int64_t rows) {
  return s == Fp8Scheme::Channel ? rows : (rows + kFp8Block - 1) / kFp8Block;
}
int64_t fp8_scale_cols(Fp8Scheme s, int64_t cols) {
  return s == Fp8Scheme::Channel ? 1 : (cols + kFp8Block - 1) / kFp8Block;
}

namespace {

float scale_of(float amax) { return amax > 0 ? amax / kE4m3Max : 1.0f; }

// Visits the (row range, col range, scale index) tiles of the scheme.
template <class F>
void for_tiles(int64_t rows, int64_t cols, Fp8Scheme s, F&& f) {
  const int64_t tr = s == Fp8Scheme::Channel ? 1 : kFp8Block, tc = s == Fp8Scheme::Channel ? cols : kFp8Block;
  const int64_t sc = fp8_scale_cols(s, cols);
  for (int64_t r0 = 0; r0 < rows; r0 += tr)
    for (int64_t c0 = 0; c0 < cols; c0 += tc)
      f(r0, std::min(rows, r0 + tr), c0, std::min(cols, c0 + tc), (r0 / tr) * sc + c0 / tc);
}

}  // namespace

void fp8_quantize(uint8_t* q, float* scale, const float* w, int64_t rows, int64_t cols, Fp8Scheme s) {
  for_tiles(rows, cols, s, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t si) {
    float amax = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    LFM2_CHECK(std::isfinite(amax), "fp8 quantize: a non-finite weight in rows [", r0, ", ", r1, ")");
    const float sc = scale_of(amax);
    scale[si] = sc;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = float_to_e4m3(w[r * cols + c] / sc);
  });
}

void fp8_dequantize(float* w, const uint8_t* q, const float* scale, int64_t rows, int64_t cols, Fp8Scheme s) {
  for_tiles(rows, cols, s, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t si) {
    const float sc = scale[si];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) w[r * cols + c] = e4m3_to_float(q[r * cols + c]) * sc;
  });
}

void fp8_fake_quantize_rows(float* x, int64_t rows, int64_t cols, int64_t group) {
  LFM2_CHECK(group > 0, "fp8 activation group ", group, " must be positive");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += group) {
      float* g = x + r * cols + c0;
      const int64_t n = std::min(group, cols - c0);
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(g[i]));
      if (!(amax > 0) || !std::isfinite(amax)) continue;  // zeros stay; non-finite is the caller's check
      const float sc = amax / kE4m3Max;
      for (int64_t i = 0; i < n; ++i) g[i] = e4m3_to_float(float_to_e4m3(g[i] / sc)) * sc;
    }
}

int64_t fp8_first_bad_scale(const float* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(scale[i]) || !(scale[i] > 0)) return i;
  return -1;
}

}  // namespace lfm2
