// The SwiGLU's quantization to e4m3 for the down product, per value: silu, the factor of a group's
// codes and the code, shared by the quantizing kernel (moe_grouped_fp8.cu: SwigluSource) and the
// gate/up product's fused epilogue (moe_padded_swiglu_fp8.cu), which must give the same bits.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/cuda/row_norm.cuh"

namespace lfm2::cuda::swiglu_e4m3 {

using row_norm::kE4m3MaxF;  // largest finite e4m3
using row_norm::scale_of;   // amax / 448, 1 for a zero group

// 2^x flushing a subnormal result to 0: __expf's exponential without the three instructions that
// build a subnormal result (a test, a halving and a squaring), so its bits wherever 2^x is normal.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// silu(g) by the fast exponential and division (a few ulps from swiglu.cu's g / (1 + expf(-g)), far
// below e4m3's half step; g < -87 gives -0 where the exact formula gives under 1e-36). The
// exponential is __expf(-g)'s (its product by log2 e, one MUFU op) with subnormals flushed: they
// arise only for g > 87, where 1 + e^-g rounds to 1 either way, so silu's bits are __expf's. The
// SwiGLU's quantization is bound by its instructions, not its bytes: this and codes by a factor
// took it from 126.7 to 86.4 us a layer at 8,192 tokens x top-4 (H200, twenty-second session).
__device__ __forceinline__ float silu_fast(float g) {
  constexpr float kMinusLog2e = -1.44269502162933349609375f;  // -log2(e) in fp32, as __expf multiplies
  return __fdividef(g, 1.0f + ex2_ftz(g * kMinusLog2e));
}

// The factor of a SwiGLU group's codes, 448 / amax, or 0 where amax < 2^-100 (a factor that could
// overflow: such groups' codes by v / s): cpu::moe_swiglu_quantize_e4m3's rule.
__device__ __forceinline__ float code_factor(float amax) { return amax >= 0x1p-100f ? kE4m3MaxF / amax : 0.f; }

// e4m3(a), e4m3(b) (a in the low byte), RNE and saturating (the hardware conversion; fp8_quantize's
// rule), one instruction.
__device__ __forceinline__ uint32_t e4m3x2_sat(float a, float b) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// The codes of a and b (a in the low byte) in a group of scale s and factor r: e4m3(v * r) for r > 0,
// else e4m3(v / s); one conversion instruction for the two.
__device__ __forceinline__ uint32_t codes2(float a, float b, float s, float r) {
  return r > 0 ? e4m3x2_sat(a * r, b * r) : e4m3x2_sat(a / s, b / s);
}

}  // namespace lfm2::cuda::swiglu_e4m3
