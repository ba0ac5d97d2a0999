// Element types of weights and activations, and exact host conversions between them.
//
// bf16 and fp16 are handled as raw 16-bit patterns on the host (uint16_t). float -> 16-bit rounds
// to nearest even, as torch and CUDA do; 16-bit -> float is exact. E4M3 (uint8_t bits, common/fp8.h)
// is a storage type only: FP8 weight files hold their quantized matrices in it, beside fp32 scales;
// no compute dtype is E4M3 and parse_dtype() does not accept it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace lfm2 {

enum class DType { F32, F16, BF16, E4M3 };

const char* dtype_name(DType t);        // "fp32", "fp16", "bf16", "e4m3"
DType parse_dtype(const std::string& s);  // accepts fp32/float32, fp16/float16, bf16/bfloat16; throws otherwise
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : t == DType::E4M3 ? 1 : 2; }

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN, keep sign
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);

// Converts n elements between any two dtypes (same dtype: a copy; to E4M3: RNE, saturating at 448).
void convert_elements(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

}  // namespace lfm2
