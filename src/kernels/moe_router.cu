// The MoE router on the GPU: one warp per token; lane l holds experts l, l+32, ...; top-k by k
// rounds of a warp-wide arg-max (the lower expert index wins ties, as on the CPU). A NaN score
// (NaN weights) ranks as -inf, so that the warp still agrees on valid experts.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kMaxPerLane = 32;  // n_experts <= 1024
constexpr int kMaxTopK = 32;

__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// done (n_tokens) or null: a row flagged there gets expert -1 in every slot (moe_drop_rows fused).
__global__ void moe_router_kernel(float* weights, int32_t* experts, const float* logits, const float* expert_bias,
                                  const float* done, int64_t n_tokens, int n_experts, int top_k, bool norm_topk,
                                  float scaling) {
  const int lane = threadIdx.x & 31;
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (t >= n_tokens) return;
  const float* lg = logits + t * n_experts;
  float score[kMaxPerLane];
  uint32_t taken = 0;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int x = lane + 32 * i;
    score[i] = -INFINITY;
    if (x < n_experts) {
      const float p = sigmoid_f32(lg[x]);
      const float sc = expert_bias ? p + expert_bias[x] : p;
      score[i] = sc != sc ? -INFINITY : sc;  // NaN loses to every number: all lanes agree on one order
    }
  }
  float w_sel = 0.f;  // lane k keeps the k-th pick's weight
  int e_sel = 0;
  float sum = 0.f;
  for (int k = 0; k < top_k; ++k) {
    // best un-taken expert of this lane (strict >: the lowest index among equals)
    float best = -INFINITY;
    int best_x = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int x = lane + 32 * i;
      if (x < n_experts && !((taken >> i) & 1u) && (best_x == 0x7fffffff || score[i] > best)) {
        best = score[i];
        best_x = x;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int ox = __shfl_xor_sync(0xffffffffu, best_x, o);
      if (ox != 0x7fffffff && (best_x == 0x7fffffff || ob > best || (ob == best && ox < best_x))) {
        best = ob;
        best_x = ox;
      }
    }
    if ((best_x & 31) == lane) taken |= 1u << (best_x >> 5);
    const float p = sigmoid_f32(lg[best_x]);
    sum += p;  // in pick order, as the CPU
    if (lane == k) {
      w_sel = p;
      e_sel = best_x;
    }
  }
  if (lane < top_k) {
    float w = w_sel;
    if (norm_topk) w /= (sum + 1e-6f);
    weights[t * top_k + lane] = w * scaling;
    experts[t * top_k + lane] = done != nullptr && done[t] != 0.f ? -1 : e_sel;
  }
}

}  // namespace

void moe_router(float* weights, int32_t* experts, const float* logits, const float* expert_bias, int64_t n_tokens,
                int64_t n_experts, int64_t top_k, bool norm_topk_prob, float routed_scaling_factor,
                cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= 32 * kMaxPerLane && top_k >= 1 && top_k <= n_experts &&
                 top_k <= kMaxTopK,
             "moe_router: top_k ", top_k, " of ", n_experts, " experts (CUDA: at most ", 32 * kMaxPerLane,
             " experts, top_k <= ", kMaxTopK, ")");
  if (n_tokens == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n_tokens * 32 + kThreads - 1) / kThreads;
  moe_router_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(weights, experts, logits, expert_bias, nullptr,
                                                               n_tokens, int(n_experts), int(top_k), norm_topk_prob,
                                                               routed_scaling_factor);
  CUDA_CHECK_LAUNCH("moe_router_kernel");
}

void moe_router_drop(float* weights, int32_t* experts, const float* logits, const float* expert_bias,
                     const float* done, int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob,
                     float routed_scaling_factor, cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= 32 * kMaxPerLane && top_k >= 1 && top_k <= n_experts &&
                 top_k <= kMaxTopK,
             "moe_router_drop: top_k ", top_k, " of ", n_experts, " experts (CUDA: at most ", 32 * kMaxPerLane,
             " experts, top_k <= ", kMaxTopK, ")");
  if (n_tokens == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n_tokens * 32 + kThreads - 1) / kThreads;
  moe_router_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(weights, experts, logits, expert_bias, done, n_tokens,
                                                               int(n_experts), int(top_k), norm_topk_prob,
                                                               routed_scaling_factor);
  CUDA_CHECK_LAUNCH("moe_router_kernel (drop)");
}

namespace {
__global__ void drop_rows_kernel(int32_t* experts, const float* done, int64_t n_pairs, int top_k) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n_pairs && done[i / top_k] != 0.f) experts[i] = -1;
}
}  // namespace

void moe_drop_rows(int32_t* experts, const float* done, int64_t n_tokens, int64_t top_k, cudaStream_t stream) {
  const int64_t n_pairs = n_tokens * top_k;
  if (n_pairs == 0) return;
  drop_rows_kernel<<<grid_for(n_pairs, 256), 256, 0, stream>>>(experts, done, n_pairs, int(top_k));
  CUDA_CHECK_LAUNCH("drop_rows_kernel");
}

}  // namespace lfm2::cuda
