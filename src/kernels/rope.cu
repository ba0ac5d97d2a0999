// Per-head q/k RMSNorm fused with RoPE on the GPU, in place on the [q | k | v] rows of one GEMM.
// One block per token, its warps taking the q and k heads in turn; lane l owns the rotation pairs
// (p, p + head_dim/2) for p = l, l+32, ..., so the norm's sum and the rotation need no shared
// memory, and the lane's angles (double, as on the CPU, rounded to fp32 once) are computed once per
// token and reused for every head: the double-precision sincos was the kernel's cost.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256

constexpr int kWarps = 4;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_kernel(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t seq_len,
                        int n_heads, int n_kv_heads, int head_dim, float eps, const int32_t* lengths,
                        int64_t first_seq, int64_t step, const int64_t* at) {
  if (at) first_seq = at[0], step = at[1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;
  const int heads = n_heads + n_kv_heads;  // the normed, rotated ones; v follows untouched
  const int half = head_dim / 2;
  // Scoring and prefill: position row % seq_len; a decode step: each sequence's own position.
  const double pos = step == 0 ? double(row % seq_len) : double(int64_t(lengths[first_seq + row]) + step - 1);
  float cs[kMaxPairsPerLane], sn[kMaxPairsPerLane];
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
  T* base = qkv + row * int64_t(heads + n_kv_heads) * head_dim;
  for (int h = warp; h < heads; h += kWarps) {
    const float* w = h < n_heads ? q_norm : k_norm;
    T* x = base + int64_t(h) * head_dim;
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
      x[p] = from_f32<T>(__fadd_rn(__fmul_rn(y1, cs[i]), __fmul_rn(-y2, sn[i])));
      x[p + half] = from_f32<T>(__fadd_rn(__fmul_rn(y2, cs[i]), __fmul_rn(y1, sn[i])));
    }
  }
}

}  // namespace

template <typename T>
void qk_norm_rope(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t n_seq,
                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                  cudaStream_t stream, const int32_t* lengths, int64_t first_seq, int64_t step, const int64_t* at) {
  LFM2_CHECK(step == 0 || (lengths && seq_len == 1), "qk_norm_rope: a decode step needs the lengths, one row each");
  LFM2_CHECK(head_dim % 2 == 0 && head_dim <= 64 * kMaxPairsPerLane, "qk_norm_rope: head_dim ", head_dim,
             " must be even and <= ", 64 * kMaxPairsPerLane);
  const int64_t n_rows = n_seq * seq_len;
  if (n_rows == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31), "qk_norm_rope: ", n_rows, " rows in one launch");
  qk_norm_rope_kernel<<<unsigned(n_rows), kWarps * 32, 0, stream>>>(
      qkv, q_norm, k_norm, inv_freq, seq_len, int(n_heads), int(n_kv_heads), int(head_dim), eps, lengths, first_seq,
      step, at);
  CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

#define INST(T)                                                                                             \
  template void qk_norm_rope<T>(T*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, \
                                int64_t, float, cudaStream_t, const int32_t*, int64_t, int64_t, const int64_t*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
