// Weighted un-permutation of the expert outputs fused with the residual add, on the GPU: one block
// per token gathers its top_k rows and sums them in ascending expert order (the CPU's and HF's
// index_add_ order: rows are grouped by ascending expert, so ascending row = ascending expert),
// in fp32, with no atomics: bit-identical run to run.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopK = 32;

// V consecutive channels per thread: 16-byte loads of the expert rows where the rows allow.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) moe_combine_kernel(float* x, const T* expert_out, const int32_t* dest_row,
                                                               const float* topk_w, int top_k, int64_t hidden) {
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {  // insertion sort of the k (row, weight) pairs by row
    for (int k = 0; k < top_k; ++k) {
      const int r = dest_row[t * top_k + k];
      const float w = topk_w[t * top_k + k];
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

}  // namespace

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

#define INST(T) \
  template void moe_combine<T>(float*, const T*, const int32_t*, const float*, int64_t, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
