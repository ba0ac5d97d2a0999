// Device helpers of the e4m3 KV cache (paged_kv.h "FP8 cache"): the quantization of one head row by
// a warp (common/fp8.h's codec: s = amax / 448, e4m3(x / s) RNE and saturating, with IEEE divisions
// as on the CPU, so the bits are the CPU's), a 4-byte cp.async for the scales, and the widening of
// 16 e4m3 bytes times their scale into 16 T for the tensor-core attention kernels (e4m3 -> half is
// exact, the product e4m3 * s one fp32 rounding as the CPU's q * s, then rounded to T as a T cache
// stores it). Included by .cu only.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/attention_mma.cuh"
#include "kernels/cuda/device_util.cuh"

namespace lfm2::cuda::kv8 {

// 4 bytes global -> shared; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mma::smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}

// e4m3 bits of v: round to nearest even, saturating at +-448, NaN -> 0x7f (sign kept).
__device__ __forceinline__ uint8_t encode(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// One warp stores a head row x (n values of T) as q (n bytes) and *scale (lane 0 writes it).
template <typename T>
__device__ __forceinline__ void quantize_row(uint8_t* q, float* scale, const T* x, int n, int lane) {
  float amax = 0.f;
  for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(to_f32(x[i])));
  amax = warp_max(amax);
  const float s = amax > 0.f && amax <= 3.4028234663852886e38f ? __fdiv_rn(amax, 448.f) : 1.f;
  for (int i = lane; i < n; i += 32) q[i] = encode(__fdiv_rn(to_f32(x[i]), s));
  if (lane == 0) *scale = s;
}

// Two e4m3 bytes (low byte first) times s as a packed pair of T.
template <typename T>
__device__ __forceinline__ uint32_t widen2(uint32_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return mma::pack2<T>(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
}

// 16 e4m3 bytes b times s into 16 T: elements 0..7 at d0, 8..15 at d1 (16-byte aligned each).
template <typename T>
__device__ __forceinline__ void widen16(T* d0, T* d1, const uint4& b, float s) {
  const uint32_t w[4] = {b.x, b.y, b.z, b.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = widen2<T>(w[i], s);
    o[2 * i + 1] = widen2<T>(w[i] >> 16, s);
  }
  *reinterpret_cast<uint4*>(d0) = make_uint4(o[0], o[1], o[2], o[3]);
  *reinterpret_cast<uint4*>(d1) = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace lfm2::cuda::kv8
