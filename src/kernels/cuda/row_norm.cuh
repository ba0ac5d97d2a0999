// The RMSNorm of one row held in registers by a block of kThreads threads, thread t holding the
// row's float4 chunks t + kThreads j (j < kMaxVec): the sums, the T output and its e4m3 codes of
// rmsnorm.cu's one-pass kernels, shared with the kernels that fuse a norm (moe_combine.cu) so that a
// fused norm has the same bits as the launch it replaces.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/cuda/device_util.cuh"

namespace lfm2::cuda::row_norm {

constexpr int kThreads = 256;
constexpr int kMaxVec = 8;           // float4 chunks a thread: rows of at most kThreads * 4 * kMaxVec

// Rows of at most 2 chunks a thread (2,048 wide), run with kVec = 2: fewer registers, more rows an
// SM (the same sums).
inline bool short_row(int64_t dim) { return dim <= int64_t(kThreads) * 4 * 2; }
constexpr float kE4m3MaxF = 448.0f;  // largest finite e4m3

// ss plus the chunk's squares, in the one order every kernel uses.
__device__ __forceinline__ float add_squares(float ss, const float4& v) {
  return ss + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
}

// 1 / rms from the threads' partial sums (block-wide: every thread calls it).
__device__ __forceinline__ float inv_rms(float ss, float* scratch, int64_t dim, float eps) {
  ss = block_sum(ss, scratch);
  return 1.0f / sqrtf(ss / float(dim) + eps);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // scratch may still be read by block_sum
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = int(threadIdx.x & 31) < int(blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// A group's e4m3 scale from its amax: s = amax / 448 (1 for a zero group), fp8_quantize's rule.
__device__ __forceinline__ float scale_of(float amax) { return amax > 0 ? amax / kE4m3MaxF : 1.0f; }

// Four e4m3 codes of v / s (RNE, saturating: moe_quantize_e4m3's conversion) in one word, two a
// conversion instruction (cvt ... e4m3x2: the same codes as one at a time).
__device__ __forceinline__ uint32_t e4m3x4(const float4& v, float s) {
  auto pair = [s](float a, float b) {
    return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a / s, b / s), __NV_SATFINITE, __NV_E4M3));
  };
  return pair(v.x, v.y) | pair(v.z, v.w) << 16;
}

__device__ __forceinline__ float abs_max4(const float4& v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Where the normed row goes: out (T, null: not written), and with q its e4m3 codes from the T
// values, per row (one scale, repeated per 128 columns) or per (row, 128 columns): the scale of group
// g at scales[g * s_ld]. dim % 128 == 0 when q is set (a warp's 32 chunks of step j are one group).
template <typename T>
struct RowOut {
  T* out;
  uint32_t* q;
  float* scales;
  int64_t s_ld;
  bool per_row;
};

// The row's outputs from its chunks v (overwritten with the T values when q is set).
template <typename T, int kVec>
__device__ __forceinline__ void write_row(const RowOut<T>& o, float4 (&v)[kVec], int chunks, const float* weight,
                                          float inv, float* scratch) {
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      const float4 w = w4[c];
      alignas(16) T t[4] = {from_f32<T>(w.x * (v[j].x * inv)), from_f32<T>(w.y * (v[j].y * inv)),
                            from_f32<T>(w.z * (v[j].z * inv)), from_f32<T>(w.w * (v[j].w * inv))};
      if (o.out) {
        T* dst = o.out + 4 * int64_t(c);
        if constexpr (sizeof(T) == 4)
          *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(t);
        else
          *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(t);
      }
      if (o.q) {
        v[j] = make_float4(to_f32(t[0]), to_f32(t[1]), to_f32(t[2]), to_f32(t[3]));  // the T outputs, in place
        amax = fmaxf(amax, abs_max4(v[j]));
      }
    }
  }
  if (!o.q) return;  // block-uniform
  if (o.per_row) {
    amax = block_max(amax, scratch);
    const float s = scale_of(amax);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int c = threadIdx.x + j * kThreads;
      if (c < chunks) o.q[c] = e4m3x4(v[j], s);
    }
    for (int64_t g = threadIdx.x; g < int64_t(chunks) / 32; g += kThreads) o.scales[g * o.s_ld] = s;
    return;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c >= chunks) continue;
    float m = abs_max4(v[j]);
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
    const float s = scale_of(m);
    o.q[c] = e4m3x4(v[j], s);
    if ((threadIdx.x & 31) == 0) o.scales[int64_t(c / 32) * o.s_ld] = s;
  }
}

}  // namespace lfm2::cuda::row_norm
