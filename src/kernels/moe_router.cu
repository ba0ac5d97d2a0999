// The MoE router on the GPU: one warp per token; lane l holds experts l, l+32, ...; top-k by k
// rounds of a warp-wide arg-max (the lower expert index wins ties, as on the CPU). A NaN score
// (NaN weights) ranks as -inf, so that the warp still agrees on valid experts.
//
// moe_route_decode (decode rows): the logits, the top-k, the drop and the permutation in one
// launch. Block b takes rows [8 b, +8): its warps compute the 8 x n_experts logits (each lane an
// fp32 sum over its 8-element chunks in ascending k, then a fixed butterfly across the warp: per
// row the same order whatever the batch), then warp w picks row 8 b + w's experts; the last block
// to finish (a counter of the decode workspace, which it resets) runs the one-block permutation.
#include "common/cuda_check.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/moe_permute_block.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kMaxPerLane = 32;  // n_experts <= 1024
constexpr int kMaxTopK = 32;

__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// The top-k of one token by its warp (all 32 lanes call it): lg, the token's n_experts logits
// (global or shared memory); its top_k (weight, expert) pairs written to weights / experts, every
// expert -1 when `dropped` (moe_drop_rows fused).
__device__ __forceinline__ void route_token(float* weights, int32_t* experts, const float* lg,
                                            const float* expert_bias, bool dropped, int n_experts, int top_k,
                                            bool norm_topk, float scaling) {
  const int lane = threadIdx.x & 31;
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
    weights[lane] = w * scaling;
    experts[lane] = dropped ? -1 : e_sel;
  }
}

// One warp per token. done (n_tokens) or null: a row flagged there gets expert -1 in every slot.
__global__ void moe_router_kernel(float* weights, int32_t* experts, const float* logits, const float* expert_bias,
                                  const float* done, int64_t n_tokens, int n_experts, int top_k, bool norm_topk,
                                  float scaling) {
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (t >= n_tokens) return;
  route_token(weights + t * top_k, experts + t * top_k, logits + t * n_experts, expert_bias,
              done != nullptr && done[t] != 0.f, n_experts, top_k, norm_topk, scaling);
}

constexpr int kRouteRows = 8;  // rows per block of moe_route_decode: one warp each
constexpr int kRouteThreads = 32 * kRouteRows;
constexpr int kRouteMaxExperts = 256;
static_assert(kRouteThreads == permute::kChunk, "the last block permutes with the block's threads");

__device__ __forceinline__ float2 pair_f32(uint32_t w, __nv_bfloat16*) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ __forceinline__ float2 pair_f32(uint32_t w, __half*) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// acc += the 8 products of two 16-byte chunks, in element order.
template <typename T>
__device__ __forceinline__ float dot8(float acc, const uint4& a, const uint4& b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = pair_f32(wa[i], static_cast<T*>(nullptr)), q = pair_f32(wb[i], static_cast<T*>(nullptr));
    acc += p.x * q.x;
    acc += p.y * q.y;
  }
  return acc;
}

struct RouteOut {
  float* weights;
  int32_t *experts, *offsets, *src_token, *dest_row;
};

template <typename T>
__global__ void __launch_bounds__(kRouteThreads) route_decode_kernel(RouteOut o, const T* in, const T* gate,
                                                                     const float* expert_bias, const float* done,
                                                                     int n_rows, int hidden, int n_experts,
                                                                     int top_k, bool norm_topk, float scaling,
                                                                     int* counter) {
  __shared__ float s_logit[kRouteRows][kRouteMaxExperts];
  __shared__ int wcount[permute::kWarps][kRouteMaxExperts];
  __shared__ int base[kRouteMaxExperts];
  __shared__ bool s_last;
  // the expert products' blocks may take their places now (they wait for this grid to finish)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * kRouteRows, nr = min(kRouteRows, n_rows - r0), chunks = hidden / 8;
  const uint4* x4 = reinterpret_cast<const uint4*>(in) + int64_t(r0) * chunks;
  const uint4* g4 = reinterpret_cast<const uint4*>(gate);
  for (int e0 = 4 * warp; e0 < n_experts; e0 += 4 * kRouteRows) {  // four experts per warp at a time
    float acc[4][kRouteRows] = {};
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      uint4 xv[kRouteRows];
#pragma unroll
      for (int r = 0; r < kRouteRows; ++r) xv[r] = r < nr ? x4[int64_t(r) * chunks + c] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (e0 + j >= n_experts) break;
        const uint4 wv = g4[int64_t(e0 + j) * chunks + c];
#pragma unroll
        for (int r = 0; r < kRouteRows; ++r) acc[j][r] = dot8<T>(acc[j][r], wv, xv[r]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < kRouteRows; ++r) {
        const float v = warp_sum(acc[j][r]);
        if (lane == 0 && e0 + j < n_experts) s_logit[r][e0 + j] = v;
      }
  }
  __syncthreads();
  if (warp < nr) {
    const int64_t t = r0 + warp;
    route_token(o.weights + t * top_k, o.experts + t * top_k, s_logit[warp], expert_bias,
                done != nullptr && done[t] != 0.f, n_experts, top_k, norm_topk, scaling);
  }
  // the last block to get here permutes every row's pairs
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  permute::permute_block<kRouteMaxExperts>(o.offsets, o.src_token, o.dest_row, o.experts, n_rows * top_k,
                                           n_experts, top_k, wcount, base);
  if (threadIdx.x == 0) *counter = 0;  // ready for the next call (and graph replays)
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

template <typename T>
void moe_route_decode(float* weights, int32_t* experts, int32_t* offsets, int32_t* src_token, int32_t* dest_row,
                      const T* in, const T* gate, const float* expert_bias, const float* done, int64_t n_tokens,
                      int64_t hidden, int64_t n_experts, int64_t top_k, bool norm_topk_prob,
                      float routed_scaling_factor, cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= kRouteMaxExperts && top_k >= 1 && top_k <= n_experts &&
                 top_k <= kMaxTopK,
             "moe_route_decode: top_k ", top_k, " of ", n_experts, " experts (at most ", kRouteMaxExperts,
             " experts, top_k <= ", kMaxTopK, ")");
  LFM2_CHECK(hidden % 8 == 0 && hidden < (int64_t(1) << 30) && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(gate) % 16 == 0 && n_tokens * top_k < (int64_t(1) << 31),
             "moe_route_decode: hidden ", hidden, " (a multiple of 8), ", n_tokens,
             " rows, in and gate 16-byte aligned");
  if (n_tokens == 0) {
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, size_t(n_experts + 1) * sizeof(int32_t), stream));
    return;
  }
  const DecodeWorkspace ws = decode_gemm_workspace();
  const unsigned blocks = unsigned((n_tokens + kRouteRows - 1) / kRouteRows);
  route_decode_kernel<T><<<blocks, kRouteThreads, 0, stream>>>(
      RouteOut{weights, experts, offsets, src_token, dest_row}, in, gate, expert_bias, done, int(n_tokens),
      int(hidden), int(n_experts), int(top_k), norm_topk_prob, routed_scaling_factor, ws.route_counter);
  CUDA_CHECK_LAUNCH("route_decode_kernel");
}

#define INST(T)                                                                                                   \
  template void moe_route_decode<T>(float*, int32_t*, int32_t*, int32_t*, int32_t*, const T*, const T*,           \
                                    const float*, const float*, int64_t, int64_t, int64_t, int64_t, bool, float, \
                                    cudaStream_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
