// Argmax and top-2 margin on the GPU (cpu::argmax_margin): one block per row, each thread keeps
// the best and second-best of a strided slice, then a warp and a block reduction. The (value,
// index) order is total (larger value first, then lower index; NaN loses to everything), so the
// result is the CPU's whatever the thread layout. Rows of 16-byte aligned float4s are read kUnroll
// float4s at a time, the loads issued before the merges (a decode step's 32 rows of a 65,536-word
// vocabulary: 48 us one float at a time, latency-bound).
#include <cfloat>

#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 512;

struct Top2 {
  float v1;  // best value (NaN only while nothing else was seen)
  int i1;    // its index (INT_MAX: none)
  float v2;  // best value at any other index (-inf: none)
};

// a beats b: larger value, then lower index; a NaN never beats a number.
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
  if (av != av) return bv != bv && ai < bi;
  if (bv != bv) return true;
  return av > bv || (av == bv && ai < bi);
}

__device__ __forceinline__ float max_num(float a, float b) {
  if (a != a) return b;
  if (b != b) return a;
  return fmaxf(a, b);
}

__device__ __forceinline__ Top2 merge(Top2 a, Top2 b) {
  Top2 r;
  if (beats(a.v1, a.i1, b.v1, b.i1)) {
    r.v1 = a.v1, r.i1 = a.i1, r.v2 = max_num(a.v2, b.v1);
  } else {
    r.v1 = b.v1, r.i1 = b.i1, r.v2 = max_num(b.v2, a.v1);
  }
  return r;
}

__device__ __forceinline__ Top2 shfl(Top2 t, int o) {
  t.v1 = __shfl_xor_sync(0xffffffffu, t.v1, o);
  t.i1 = __shfl_xor_sync(0xffffffffu, t.i1, o);
  t.v2 = __shfl_xor_sync(0xffffffffu, t.v2, o);
  return t;
}

constexpr int kUnroll = 4;

template <bool kVec>
__global__ void __launch_bounds__(kThreads) argmax_margin_kernel(int32_t* out, float* margin, const float* in,
                                                                 int64_t n_cols) {
  __shared__ Top2 s_warp[kThreads / 32];
  const float* x = in + blockIdx.x * n_cols;
  Top2 t{NAN, INT_MAX, -INFINITY};
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int64_t n4 = n_cols / 4;
    for (int64_t c0 = threadIdx.x; c0 < n4; c0 += int64_t(kThreads) * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kThreads;
        if (c < n4) v[u] = x4[c];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c0 + int64_t(u) * kThreads >= n4) break;
        const int j = int(4 * (c0 + int64_t(u) * kThreads));
        t = merge(t, Top2{v[u].x, j, -INFINITY});
        t = merge(t, Top2{v[u].y, j + 1, -INFINITY});
        t = merge(t, Top2{v[u].z, j + 2, -INFINITY});
        t = merge(t, Top2{v[u].w, j + 3, -INFINITY});
      }
    }
  } else {
    for (int64_t j = threadIdx.x; j < n_cols; j += kThreads) t = merge(t, Top2{x[j], int(j), -INFINITY});
  }
  for (int o = 16; o > 0; o >>= 1) t = merge(t, shfl(t, o));
  if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = t;
  __syncthreads();
  if (threadIdx.x < 32) {
    t = threadIdx.x < kThreads / 32 ? s_warp[threadIdx.x] : Top2{NAN, INT_MAX, -INFINITY};
    for (int o = 16; o > 0; o >>= 1) t = merge(t, shfl(t, o));
    if (threadIdx.x == 0) {
      const bool none = t.i1 == INT_MAX;
      out[blockIdx.x] = none ? 0 : t.i1;
      margin[blockIdx.x] = none ? NAN : t.v1 - t.v2;
    }
  }
}

}  // namespace

void argmax_margin(int32_t* out, float* margin, const float* in, int64_t n_rows, int64_t n_cols, cudaStream_t stream) {
  LFM2_CHECK(n_cols >= 1 && n_cols < (int64_t(1) << 31), "argmax_margin: ", n_cols, " columns");
  if (n_rows == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31), "argmax_margin: ", n_rows, " rows");
  if (n_cols % 4 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0)
    argmax_margin_kernel<true><<<unsigned(n_rows), kThreads, 0, stream>>>(out, margin, in, n_cols);
  else
    argmax_margin_kernel<false><<<unsigned(n_rows), kThreads, 0, stream>>>(out, margin, in, n_cols);
  CUDA_CHECK_LAUNCH("argmax_margin_kernel");
}

}  // namespace lfm2::cuda
