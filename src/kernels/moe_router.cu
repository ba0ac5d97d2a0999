// The MoE router on the GPU: one warp per token; lane l holds experts l, l+32, ...; top-k by k
// rounds of a warp-wide arg-max (the lower expert index wins ties, as on the CPU): two warp
// reductions of an order-preserving key (redux.sync) a round instead of a 10-shuffle chain (the
// same picks; in the step 1.2 us less a layer, and the FP8 step 0.7-0.9 % faster, where gate/up
// waits for the whole router). A NaN score (NaN weights) ranks as -inf, so that the warp still
// agrees on valid experts.
//
// moe_route_decode (decode rows): the logits, the top-k, the drop and the permutation in one
// launch. Block b takes rows [8 b, +8): its warps compute the 8 x n_experts logits on the tensor
// cores (fp32 accumulation in an order fixed by hidden alone: per row the same arithmetic whatever
// the batch), then warp w picks row 8 b + w's experts; the last block to finish (a counter of the
// decode workspace, which it resets) runs the one-block permutation. A programmatic dependent of
// the launch before it; it lets the expert products launch once its logits are read. H100: 13.6 us
// at 32 rows, 17.9 at 256 (logits by cuBLASLt + moe_router_drop + moe_permute_one_block: 22.5 /
// 26.1); fp32 dot products on the CUDA cores took 22-26 us (four to 32 blocks issuing ~8k
// instructions a lane). In the step at 32 x 8192, 15.3 us a layer before the top-k's loops were
// bounded by the experts a lane holds (and the launch made programmatic), 14.4 after.
#include "common/cuda_check.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/moe_permute_block.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kMaxPerLane = 32;  // n_experts <= 1024
constexpr int kMaxTopK = 32;

__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// A score as an unsigned key in the same order (finite or infinite, never NaN: the callers map NaN
// to -inf first; -0 is made +0, the equal of it). Every score's key is >= 0x007fffff (-inf's), so
// 0 marks "no candidate".
__device__ __forceinline__ uint32_t order_key(float s) {
  const uint32_t u = __float_as_uint(s + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The warp's max / min of an unsigned value (one redux.sync on compute capability 8.0 and later).
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
#endif
}
__device__ __forceinline__ uint32_t warp_min_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_min_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
#endif
}

// The top-k of one token by its warp (all 32 lanes call it): lg, the token's n_experts logits
// (global or shared memory); its top_k (weight, expert) pairs written to weights / experts, every
// expert -1 when `dropped` (moe_drop_rows fused). kPerLane: experts per lane at most (n_experts <=
// 32 kPerLane); a smaller one only drops the loop iterations no lane uses (the same picks).
// A pick: each lane's best un-taken expert (the lowest index among equals), the warp's best key,
// then the lowest expert index holding it: two warp reductions, not a shuffle chain.
template <int kPerLane = kMaxPerLane>
__device__ __forceinline__ void route_token(float* weights, int32_t* experts, const float* lg,
                                            const float* expert_bias, bool dropped, int n_experts, int top_k,
                                            bool norm_topk, float scaling) {
  const int lane = threadIdx.x & 31;
  uint32_t key[kPerLane];  // 0: past n_experts, or taken
  float prob[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int x = lane + 32 * i;
    key[i] = 0;
    prob[i] = 0.f;
    if (x < n_experts) {
      prob[i] = sigmoid_f32(lg[x]);
      const float sc = expert_bias ? prob[i] + expert_bias[x] : prob[i];
      key[i] = order_key(sc != sc ? -INFINITY : sc);  // NaN loses to every number: all lanes agree on one order
    }
  }
  float w_sel = 0.f;  // lane k keeps the k-th pick's weight
  int e_sel = 0;
  float sum = 0.f;
  for (int k = 0; k < top_k; ++k) {
    uint32_t best = 0;
    int best_i = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (key[i] > best) {  // strict: the lowest index among equals
        best = key[i];
        best_i = i;
      }
    const uint32_t top = warp_max_u32(best);
    const int best_x = int(warp_min_u32(best == top ? uint32_t(lane + 32 * best_i) : 0xffffffffu));
    const int owner = best_x & 31, slot = best_x >> 5;
    float p_own = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i == slot) {
        p_own = prob[i];
        if (lane == owner) key[i] = 0;
      }
    const float p = __shfl_sync(0xffffffffu, p_own, owner);
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

constexpr int kRouteRows = 8;  // rows per block of moe_route_decode: one warp each, one n8 tile
constexpr int kRouteWarps = kRouteRows;
constexpr int kRouteThreads = 32 * kRouteWarps;
constexpr int kRouteMaxExperts = 256;
constexpr int kRouteGroup = 32;  // experts per pass of the logits: two m16 tiles
static_assert(kRouteThreads == permute::kChunk, "the last block permutes with the block's threads");
static_assert(kRouteGroup * kRouteRows == kRouteThreads, "one thread per (expert, row) of a group");

struct RouteOut {
  float* weights;
  int32_t *experts, *offsets, *src_token, *dest_row;
};

// The logits of the block's rows r0 .. r0 + nr - 1 into s_logit, on the tensor cores, 32 experts at
// a time: gate rows as the A operand (two m16 tiles), the block's rows as the B operand (one n8
// tile), fragments straight from global memory (gemv_mma.cuh); warp w sums the 64-k blocks w, w + 8,
// ... in order, then the warps' partial sums are added in warp order. Each logit: the same
// arithmetic whatever the other rows.
template <typename T>
__device__ __forceinline__ void route_logits(float (&s_logit)[kRouteRows][kRouteMaxExperts],
                                             float (&s_part)[kRouteWarps][kRouteGroup][kRouteRows], const T* in,
                                             const T* gate, int r0, int nr, int hidden, int n_experts, int warp,
                                             int lane, int g, int q) {
  const T* brow = g < nr ? in + int64_t(r0 + g) * hidden : nullptr;
  for (int e0 = 0; e0 < n_experts; e0 += kRouteGroup) {
    const T* arow[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = e0 + 16 * m + g + 8 * r;
        arow[m][r] = e < n_experts ? gate + int64_t(e) * hidden : nullptr;
      }
    float acc[2][1][4] = {};
#pragma unroll 2
    for (int64_t kb = int64_t(warp) * gemv::kBlockK; kb < hidden; kb += int64_t(kRouteWarps) * gemv::kBlockK) {
      gemv::Frag a[2][2];
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) a[m][r] = gemv::load_frag<T, 1>(arow[m][r], kb, hidden, q);
      const gemv::Frag b = gemv::load_frag<T, 1>(brow, kb, hidden, q);
      gemv::step<T, 2, 1, 0>(acc, 0, a, b);
      gemv::step<T, 2, 1, 1>(acc, 0, a, b);
      gemv::step<T, 2, 1, 2>(acc, 0, a, b);
      gemv::step<T, 2, 1, 3>(acc, 0, a, b);
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        s_part[warp][16 * m + gemv::acc_row(lane, c)][gemv::acc_col(lane, c)] = acc[m][0][c];
    __syncthreads();
    {
      const int e = threadIdx.x / kRouteRows, r = threadIdx.x % kRouteRows;
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kRouteWarps; ++w) v += s_part[w][e][r];
      if (e0 + e < n_experts) s_logit[r][e0 + e] = v;
    }
    __syncthreads();  // s_part is rewritten by the next group
  }
}

template <typename T>
__global__ void __launch_bounds__(kRouteThreads) route_decode_kernel(RouteOut o, const T* in, const T* gate,
                                                                     const float* expert_bias, const float* done,
                                                                     int n_rows, int hidden, int n_experts,
                                                                     int top_k, bool norm_topk, float scaling,
                                                                     int* counter) {
  __shared__ float s_logit[kRouteRows][kRouteMaxExperts];
  __shared__ float s_part[kRouteWarps][kRouteGroup][kRouteRows];
  __shared__ int wcount[permute::kWarps][kRouteMaxExperts];
  __shared__ int base[kRouteMaxExperts];
  __shared__ bool s_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int r0 = blockIdx.x * kRouteRows, nr = min(kRouteRows, n_rows - r0);
  // Launched as a programmatic dependent of the kernel before (the rows' norm): the gate's rows are
  // fetched into L2 (the blocks share them out) before the grid waits for its input rows. The
  // expert products may launch once the logits are read (they wait for this grid's end before
  // reading anything it writes; at this grid's start they slowed its loads: 7.90 vs 7.79 ms a step
  // at 32 x 8192).
  const int stride = int(gridDim.x) * kRouteThreads;
  for (int e = int(blockIdx.x) + int(gridDim.x) * int(threadIdx.x); e < n_experts; e += stride)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gate + int64_t(e) * hidden),
                 "r"(uint32_t(hidden * int(sizeof(T))))
                 : "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  route_logits(s_logit, s_part, in, gate, r0, nr, hidden, n_experts, warp, lane, g, q);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (warp < nr) {
    const int64_t t = r0 + warp;
    const bool dropped = done != nullptr && done[t] != 0.f;
    float* w = o.weights + t * top_k;
    int32_t* e = o.experts + t * top_k;
    // the lanes' share of the experts bounds the top-k's loops (32 experts: one each, as the model)
    if (n_experts <= 32)
      route_token<1>(w, e, s_logit[warp], expert_bias, dropped, n_experts, top_k, norm_topk, scaling);
    else if (n_experts <= 64)
      route_token<2>(w, e, s_logit[warp], expert_bias, dropped, n_experts, top_k, norm_topk, scaling);
    else
      route_token<kRouteMaxExperts / 32>(w, e, s_logit[warp], expert_bias, dropped, n_experts, top_k, norm_topk,
                                         scaling);
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
  launch_pdl(route_decode_kernel<T>, dim3(blocks), dim3(kRouteThreads), 0, stream, true,
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
