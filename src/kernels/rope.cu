// Per-head q/k RMSNorm fused with RoPE on the GPU, in place on the [q | k | v] rows of one GEMM.
// One warp per (token, head); lane l owns the rotation pairs (p, p + head_dim/2) for p = l, l+32, ...
// so the norm's sum and the rotation need no shared memory. Angles in double as on the CPU.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256

template <typename T>
__global__ void qk_norm_rope_kernel(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq,
                                    int64_t n_rows, int64_t seq_len, int n_heads, int n_kv_heads, int head_dim,
                                    float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int heads = n_heads + n_kv_heads;
  if (item >= n_rows * heads) return;  // whole warps leave together
  const int64_t row = item / heads;
  const int h = int(item - row * heads);
  const int half = head_dim / 2;
  const float* w = h < n_heads ? q_norm : k_norm;
  T* x = qkv + row * int64_t(heads + n_kv_heads) * head_dim + int64_t(h) * head_dim;
  const double pos = double(row % seq_len);

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
    double sd, cd;
    sincos(pos * double(inv_freq[p]), &sd, &cd);
    const float cs = float(cd), sn = float(sd);
    x[p] = from_f32<T>(__fadd_rn(__fmul_rn(y1, cs), __fmul_rn(-y2, sn)));
    x[p + half] = from_f32<T>(__fadd_rn(__fmul_rn(y2, cs), __fmul_rn(y1, sn)));
  }
}

}  // namespace

template <typename T>
void qk_norm_rope(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t n_seq,
                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                  cudaStream_t stream) {
  LFM2_CHECK(head_dim % 2 == 0 && head_dim <= 64 * kMaxPairsPerLane, "qk_norm_rope: head_dim ", head_dim,
             " must be even and <= ", 64 * kMaxPairsPerLane);
  const int64_t n_rows = n_seq * seq_len, n_items = n_rows * (n_heads + n_kv_heads);
  if (n_items == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n_items * 32 + kThreads - 1) / kThreads;
  qk_norm_rope_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(qkv, q_norm, k_norm, inv_freq, n_rows, seq_len,
                                                                 int(n_heads), int(n_kv_heads), int(head_dim), eps);
  CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

#define INST(T)                                                                                             \
  template void qk_norm_rope<T>(T*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, \
                                int64_t, float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
