// Per-head q/k RMSNorm + RoPE on one warp, shared by qk_norm_rope (rope.cu) and the fused paged
// store (rope_store.cu) so that both give the same bits. Lane l owns the rotation pairs
// (p, p + head_dim/2) for p = l, l+32, ...; the norm's sum is a warp sum, and the lane's angles
// (double, as on the CPU, rounded to fp32 once) are computed once per token for every head.
// Included by .cu files only.
#pragma once

#include "kernels/cuda/device_util.cuh"

namespace lfm2::cuda::rope_dev {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256

// cos / sin of pos * inv_freq[p] for the lane's pairs (1 / 0 past half).
__device__ __forceinline__ void angles(float (&cs)[kMaxPairsPerLane], float (&sn)[kMaxPairsPerLane], double pos,
                                       const float* inv_freq, int half, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPairsPerLane; ++i) {
    const int p = lane + 32 * i;
    cs[i] = 1.f, sn[i] = 0.f;
    if (p < half) {
      double sd, cd;
      sincos(pos * double(inv_freq[p]), &sd, &cd);
      cs[i] = float(cd), sn[i] = float(sd);
    }
  }
}

// x (head_dim) = rope(w * rmsnorm(x)) in place; also written to copy (head_dim) unless null.
template <typename T>
__device__ __forceinline__ void norm_rope_head(T* x, T* copy, const float* w, const float (&cs)[kMaxPairsPerLane],
                                               const float (&sn)[kMaxPairsPerLane], int head_dim, float eps,
                                               int lane) {
  const int half = head_dim / 2;
  float x1[kMaxPairsPerLane], x2[kMaxPairsPerLane];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPairsPerLane; ++i) {
    const int p = lane + 32 * i;
    x1[i] = p < half ? to_f32(x[p]) : 0.f;
    x2[i] = p < half ? to_f32(x[p + half]) : 0.f;
    ss += x1[i] * x1[i] + x2[i] * x2[i];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
#pragma unroll
  for (int i = 0; i < kMaxPairsPerLane; ++i) {
    const int p = lane + 32 * i;
    if (p >= half) break;
    const float y1 = w[p] * (x1[i] * inv), y2 = w[p + half] * (x2[i] * inv);
    const T r1 = from_f32<T>(__fadd_rn(__fmul_rn(y1, cs[i]), __fmul_rn(-y2, sn[i])));
    const T r2 = from_f32<T>(__fadd_rn(__fmul_rn(y2, cs[i]), __fmul_rn(y1, sn[i])));
    x[p] = r1;
    x[p + half] = r2;
    if (copy) {
      copy[p] = r1;
      copy[p + half] = r2;
    }
  }
}

}  // namespace lfm2::cuda::rope_dev
