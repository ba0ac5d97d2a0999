// Per-head q/k RMSNorm fused with RoPE on the GPU, in place on the [q | k | v] rows of one GEMM.
// One block per token, its warps taking the q and k heads in turn (rope.cuh: a lane owns rotation
// pairs, so the norm's sum and the rotation need no shared memory, and the lane's angles are
// computed once per token and reused for every head: the double-precision sincos was the cost).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/rope.cuh"

namespace lfm2::cuda {
namespace {

using rope_dev::kMaxPairsPerLane;

constexpr int kWarps = 4;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_kernel(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t seq_len,
                        int n_heads, int n_kv_heads, int head_dim, float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;
  const int heads = n_heads + n_kv_heads;  // the normed, rotated ones; v follows untouched
  const double pos = double(row % seq_len);
  float cs[kMaxPairsPerLane], sn[kMaxPairsPerLane];
  rope_dev::angles(cs, sn, pos, inv_freq, head_dim / 2, lane);
  T* base = qkv + row * int64_t(heads + n_kv_heads) * head_dim;
  for (int h = warp; h < heads; h += kWarps)
    rope_dev::norm_rope_head<T>(base + int64_t(h) * head_dim, nullptr, h < n_heads ? q_norm : k_norm, cs, sn,
                                head_dim, eps, lane);
}

}  // namespace

template <typename T>
void qk_norm_rope(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t n_seq,
                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                  cudaStream_t stream) {
  LFM2_CHECK(head_dim % 2 == 0 && head_dim <= 64 * kMaxPairsPerLane, "qk_norm_rope: head_dim ", head_dim,
             " must be even and <= ", 64 * kMaxPairsPerLane);
  const int64_t n_rows = n_seq * seq_len;
  if (n_rows == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31), "qk_norm_rope: ", n_rows, " rows in one launch");
  qk_norm_rope_kernel<<<unsigned(n_rows), kWarps * 32, 0, stream>>>(
      qkv, q_norm, k_norm, inv_freq, seq_len, int(n_heads), int(n_kv_heads), int(head_dim), eps);
  CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

#define INST(T)                                                                                             \
  template void qk_norm_rope<T>(T*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, \
                                int64_t, float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
