// FP8 e4m3 (OCP 8-bit floating point, "E4M3FN": no infinities, S.1111.111 is NaN, max 448) and the
// quantization of matrices to it with fp32 scales (docs/fp8.md).
//
// A quantized matrix W (rows, cols) is stored as q = e4m3(W / s) with fp32 scales s > 0, and
// dequantizes as W ~ q * s:
//   channel:  one scale per output row,                 s (rows)
//   block128: one scale per 128 x 128 block (edges cut), s (ceil(rows/128), ceil(cols/128))
// s = amax / 448 over the row or block (amax 0: s = 1), so the largest magnitude maps to 448.
// Encoding rounds to nearest even and saturates at +-448 (the OCP spec's saturating mode);
// decoding is exact.
#pragma once

#include <cstdint>
#include <string>

namespace lfm2 {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr int64_t kFp8Block = 128;

enum class Fp8Scheme { Channel, Block128 };

const char* fp8_scheme_name(Fp8Scheme s);  // "channel", "block128"
Fp8Scheme parse_fp8_scheme(const std::string& s);

float e4m3_to_float(uint8_t b);
uint8_t float_to_e4m3(float f);  // RNE, saturating; NaN -> 0x7f (sign kept)
inline bool e4m3_is_nan(uint8_t b) { return (b & 0x7f) == 0x7f; }

// Scale shape of a (rows, cols) matrix under the scheme: {rows} or {ceil(rows/128), ceil(cols/128)}.
int64_t fp8_scale_rows(Fp8Scheme s, int64_t rows);
int64_t fp8_scale_cols(Fp8Scheme s, int64_t cols);  // 1 for channel

// Quantizes one matrix w (rows, cols): q (rows, cols) e4m3 bits, scale as above.
void fp8_quantize(uint8_t* q, float* scale, const float* w, int64_t rows, int64_t cols, Fp8Scheme s);
// w = q * scale (one fp32 rounding per element).
void fp8_dequantize(float* w, const uint8_t* q, const float* scale, int64_t rows, int64_t cols, Fp8Scheme s);

// Activations: each row's groups of `group` columns (group = cols: per token) replaced in place by
// e4m3(x / s) * s, s = amax / 448 of the group (amax 0: unchanged). The CPU twin of the GPU's
// on-the-fly activation quantization; see kernels/fp8_quant.h.
void fp8_fake_quantize_rows(float* x, int64_t rows, int64_t cols, int64_t group);

// The first scale that is not finite and > 0, or -1.
int64_t fp8_first_bad_scale(const float* scale, int64_t n);

}  // namespace lfm2
