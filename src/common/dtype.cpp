#include "common/dtype.h"

#include <cmath>

#include "common/error.h"
#include "common/fp8.h"

namespace lfm2 {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::F32;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw Error(cat("unknown dtype '", s, "' (expected fp32, fp16 or bf16)"));
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {                                                            // zero / subnormal
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal (or zero)
    // Scale so that the 10 mantissa bits land in an integer, then round to nearest even.
    float v = bits_to_float(a) * 16777216.0f;  // * 2^24, exact
    float r = std::nearbyint(v);               // default rounding mode: nearest even
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t e = (a >> 23) - 112;  // rebias 127 -> 15
  uint32_t m = a & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return uint16_t(sign | h);
}

void convert_elements(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, n * dtype_size(dst_type));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (src_type) {
      case DType::F32: return static_cast<const float*>(src)[i];
      case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(src)[i]);
      case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      case DType::E4M3: return e4m3_to_float(static_cast<const uint8_t*>(src)[i]);
    }
    return 0;
  };
  switch (dst_type) {
    case DType::F32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = load(i);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_fp16(load(i));
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = float_to_bf16(load(i));
      break;
    case DType::E4M3:
      for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = float_to_e4m3(load(i));
      break;
  }
}

}  // namespace lfm2
