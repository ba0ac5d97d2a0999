// Weighted un-permutation of the expert outputs fused with the residual add, on the GPU: one block
// per token gathers its top_k rows and sums them in ascending expert order (the CPU's and HF's
// index_add_ order: rows are grouped by ascending expert, so ascending row = ascending expert),
// in fp32, with no atomics: bit-identical run to run. moe_combine_rmsnorm (decode) adds the next
// layer's RMSNorm of the updated rows in the same launch, with rmsnorm.cu's arithmetic (H100, 2048
// wide: 4.2 / 4.8 us at 32 / 256 rows, where moe_combine + rmsnorm take 10.1 / 10.1).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/moe_rows.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopK = 32;

// The k (row, weight) pairs of token t sorted by row (dropped pairs, row -1, first): read by the
// first k threads at once (one L2 round trip, not k in a row), insertion-sorted by thread 0.
__device__ __forceinline__ void sorted_pairs(int* s_row, float* s_w, const int32_t* dest_row, const float* topk_w,
                                             int64_t t, int top_k) {
  __shared__ int s_in_row[kMaxTopK];
  __shared__ float s_in_w[kMaxTopK];
  if (threadIdx.x < top_k) {
    s_in_row[threadIdx.x] = __ldcg(dest_row + t * top_k + threadIdx.x);  // L2: see combine_rmsnorm_kernel
    s_in_w[threadIdx.x] = __ldcg(topk_w + t * top_k + threadIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 0; k < top_k; ++k) {
      const int r = s_in_row[k];
      const float w = s_in_w[k];
      int j = k;
      while (j > 0 && s_row[j - 1] > r) {
        s_row[j] = s_row[j - 1];
        s_w[j] = s_w[j - 1];
        --j;
      }
      s_row[j] = r;
      s_w[j] = w;
    }
  }
  __syncthreads();
}

// V consecutive channels per thread: 16-byte loads of the expert rows where the rows allow.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) moe_combine_kernel(float* x, const T* expert_out, const int32_t* dest_row,
                                                               const float* topk_w, int top_k, int64_t hidden) {
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int64_t t = blockIdx.x;
  sorted_pairs(s_row, s_w, dest_row, topk_w, t, top_k);
  float* xr = x + t * hidden;
  for (int64_t c = int64_t(threadIdx.x) * V; c < hidden; c += int64_t(kThreads) * V) {
    float acc[V] = {};
    for (int k = 0; k < top_k; ++k) {
      if (s_row[k] < 0) continue;  // a dropped pair (sorted first)
      alignas(16) T y[V];
      const T* src = expert_out + int64_t(s_row[k]) * hidden + c;
      if constexpr (V * sizeof(T) == 16)
        *reinterpret_cast<uint4*>(y) = *reinterpret_cast<const uint4*>(src);
      else
        for (int j = 0; j < V; ++j) y[j] = src[j];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_f32(y[j]) * s_w[k];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) xr[c + j] += acc[j];
  }
}

constexpr int kMaxVec = 8;  // float4 chunks per thread: hidden <= kThreads * 4 * kMaxVec

// One block per token: x += its k fp32 expert rows (moe_combine_kernel<float, 4>'s sums: chunk c of
// thread t is channels 4 (t + kThreads j)), then out = rmsnorm(x) (rmsnorm_vec_kernel's sums over
// the same chunks) when norm_w is not null. A programmatic dependent: waits before reading the
// expert rows and x (the pairs, written two launches back, before).
template <typename T>
__global__ void __launch_bounds__(kThreads) combine_rmsnorm_kernel(T* out, float* x, const float* expert_out,
                                                                   const int32_t* dest_row, const float* topk_w,
                                                                   const float* norm_w, int top_k, int64_t hidden,
                                                                   float eps) {
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ float scratch[32];
  // the pairs come from the router, complete before the kernel this one depends on could start
  // its work (moe_decode: router, gate/up, down, this), so they are read before the wait
  const int64_t t = blockIdx.x;
  sorted_pairs(s_row, s_w, dest_row, topk_w, t, top_k);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  float4* xr = reinterpret_cast<float4*>(x + t * hidden);
  const float4* y4 = reinterpret_cast<const float4*>(expert_out);
  const int chunks = int(hidden / 4);
  float4 v[kMaxVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      float acc[4] = {};
      for (int k = 0; k < top_k; ++k) {
        if (s_row[k] < 0) continue;
        const float4 y = y4[int64_t(s_row[k]) * chunks + c];
        acc[0] += y.x * s_w[k];
        acc[1] += y.y * s_w[k];
        acc[2] += y.z * s_w[k];
        acc[3] += y.w * s_w[k];
      }
      v[j] = xr[c];
      v[j].x += acc[0], v[j].y += acc[1], v[j].z += acc[2], v[j].w += acc[3];
      xr[c] = v[j];
      ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
  }
  if (norm_w == nullptr) return;
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(hidden) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(norm_w);
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      const float4 w = w4[c];
      alignas(16) T o[4] = {from_f32<T>(w.x * (v[j].x * inv)), from_f32<T>(w.y * (v[j].y * inv)),
                            from_f32<T>(w.z * (v[j].z * inv)), from_f32<T>(w.w * (v[j].w * inv))};
      T* dst = out + t * hidden + 4 * int64_t(c);
      if constexpr (sizeof(T) == 4)
        *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(o);
      else
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(o);
    }
  }
}

// moe_combine_kernel<bf16, 8> on down's raw sums of the channel scheme (grouped_gemm_fp8.h:
// moe_combine_fp8_scaled): each pair's row scaled by its activation scale and its expert's weight
// scale per channel before the routing weight.
__global__ void __launch_bounds__(kThreads)
    moe_combine_fp8_scaled_kernel(float* x, const __nv_bfloat16* expert_out, const int32_t* dest_row,
                                  const float* topk_w, const float* act_scales, const float* w2_scales,
                                  const int32_t* offsets, int n_experts, int top_k, int64_t hidden, int64_t groups) {
  constexpr int V = 8;
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK], s_a[kMaxTopK];
  __shared__ const float* s_sw[kMaxTopK];
  const int64_t t = blockIdx.x;
  sorted_pairs(s_row, s_w, dest_row, topk_w, t, top_k);
  if (threadIdx.x < top_k && s_row[threadIdx.x] >= 0) {
    const int p = s_row[threadIdx.x];
    int64_t r0 = 0, m = 0;
    const int e = row_expert(p, offsets, n_experts, r0, m);
    s_a[threadIdx.x] = act_scales[r0 * groups + (p - r0)];
    s_sw[threadIdx.x] = w2_scales + int64_t(e) * groups * hidden;
  }
  __syncthreads();
  float* xr = x + t * hidden;
  for (int64_t c = int64_t(threadIdx.x) * V; c < hidden; c += int64_t(kThreads) * V) {
    float acc[V] = {};
    for (int k = 0; k < top_k; ++k) {
      if (s_row[k] < 0) continue;  // a dropped pair (sorted first)
      alignas(16) __nv_bfloat16 y[V];
      alignas(16) float sw[V];
      *reinterpret_cast<uint4*>(y) = *reinterpret_cast<const uint4*>(expert_out + int64_t(s_row[k]) * hidden + c);
      *reinterpret_cast<float4*>(sw) = __ldg(reinterpret_cast<const float4*>(s_sw[k] + c));
      *reinterpret_cast<float4*>(sw + 4) = __ldg(reinterpret_cast<const float4*>(s_sw[k] + c + 4));
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_f32(y[j]) * s_a[k] * sw[j] * s_w[k];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) xr[c + j] += acc[j];
  }
}

}  // namespace

void moe_combine_fp8_scaled(float* x, const __nv_bfloat16* expert_out, const int32_t* dest_row, const float* weights,
                            const float* act_scales, const float* w2_scales, const int32_t* offsets,
                            int64_t n_tokens, int64_t n_experts, int64_t top_k, int64_t hidden, int64_t inter,
                            cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK && n_experts >= 1 && n_experts < (int64_t(1) << 31) &&
                 hidden % 8 == 0 && inter % 128 == 0 && aligned16(expert_out) && aligned16(w2_scales),
             "moe_combine_fp8_scaled: top_k ", top_k, ", ", n_experts, " experts, hidden ", hidden, ", inter ", inter,
             " (hidden a multiple of 8, inter of 128; 16-byte aligned rows)");
  if (n_tokens == 0) return;
  moe_combine_fp8_scaled_kernel<<<unsigned(n_tokens), kThreads, 0, stream>>>(
      x, expert_out, dest_row, weights, act_scales, w2_scales, offsets, int(n_experts), int(top_k), hidden,
      inter / 128);
  CUDA_CHECK_LAUNCH("moe_combine_fp8_scaled_kernel");
}

template <typename T>
void moe_combine(float* x, const T* expert_out, const int32_t* dest_row, const float* topk_w, int64_t n_tokens,
                 int64_t top_k, int64_t hidden, cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK, "moe_combine: top_k ", top_k, " (at most ", kMaxTopK, ")");
  if (n_tokens == 0) return;
  constexpr int V = 16 / sizeof(T);
  if (hidden % V == 0 && reinterpret_cast<uintptr_t>(expert_out) % 16 == 0)
    moe_combine_kernel<T, V><<<unsigned(n_tokens), kThreads, 0, stream>>>(x, expert_out, dest_row, topk_w,
                                                                          int(top_k), hidden);
  else
    moe_combine_kernel<T, 1><<<unsigned(n_tokens), kThreads, 0, stream>>>(x, expert_out, dest_row, topk_w,
                                                                          int(top_k), hidden);
  CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

template <typename T>
void moe_combine_rmsnorm(T* out, float* x, const float* expert_out, const int32_t* dest_row, const float* weights,
                         const float* norm_weight, int64_t n_tokens, int64_t top_k, int64_t hidden, float eps,
                         cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK, "moe_combine_rmsnorm: top_k ", top_k, " (at most ", kMaxTopK, ")");
  LFM2_CHECK(hidden % 4 == 0 && hidden <= int64_t(kThreads) * 4 * kMaxVec &&
                 reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(expert_out) % 16 == 0 &&
                 (norm_weight == nullptr || (reinterpret_cast<uintptr_t>(norm_weight) % 16 == 0 &&
                                             reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0)),
             "moe_combine_rmsnorm: hidden ", hidden, " (a multiple of 4, at most ", kThreads * 4 * kMaxVec,
             ") or unaligned buffers");
  if (n_tokens == 0) return;
  launch_pdl(combine_rmsnorm_kernel<T>, dim3(unsigned(n_tokens)), dim3(kThreads), 0, stream, true, out, x, expert_out,
             dest_row, weights, norm_weight, int(top_k), hidden, eps);
  CUDA_CHECK_LAUNCH("combine_rmsnorm_kernel");
}

#define INST(T)                                                                                                     \
  template void moe_combine<T>(float*, const T*, const int32_t*, const float*, int64_t, int64_t, int64_t,         \
                               cudaStream_t);                                                                     \
  template void moe_combine_rmsnorm<T>(T*, float*, const float*, const int32_t*, const float*, const float*,      \
                                       int64_t, int64_t, int64_t, float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
