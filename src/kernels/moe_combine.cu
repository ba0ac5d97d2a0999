// Weighted un-permutation of the expert outputs fused with the residual add, on the GPU: one block
// per token gathers its top_k rows and sums them in ascending expert order (the CPU's and HF's
// index_add_ order: rows are grouped by ascending expert, so ascending row = ascending expert),
// in fp32, with no atomics: bit-identical run to run. moe_combine_rmsnorm (decode) adds the next
// layer's RMSNorm of the updated rows in the same launch, with rmsnorm.cu's arithmetic (H100, 2048
// wide: 4.2 / 4.8 us at 32 / 256 rows, where moe_combine + rmsnorm take 10.1 / 10.1);
// moe_combine_norm does the same for prompt rows (16-bit expert rows; the norm's e4m3 codes too).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/moe_rows.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_norm.cuh"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = row_norm::kThreads;
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

// x[0, V) += acc; V % 4 == 0: float4 read-modify-writes (x 16-byte aligned: the launchers check).
// The same sums as one float at a time (H100, 8,192 tokens x top-4 at 2,048 wide: 90 against 106 us).
template <int V>
__device__ __forceinline__ void add_into(float* x, const float (&acc)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      float4 o = *reinterpret_cast<const float4*>(x + j);
      o.x += acc[j], o.y += acc[j + 1], o.z += acc[j + 2], o.w += acc[j + 3];
      *reinterpret_cast<float4*>(x + j) = o;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] += acc[j];
  }
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
    add_into(xr + c, acc);
  }
}

using row_norm::kMaxVec;

// Four consecutive values of an expert row as fp32: fp32 rows (the decode MoE's) or 16-bit ones.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <typename E>
__device__ __forceinline__ float4 load4(const E* p) {
  alignas(8) E e[4];
  *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(p);
  return make_float4(to_f32(e[0]), to_f32(e[1]), to_f32(e[2]), to_f32(e[3]));
}

// One block per token: x += its k expert rows (moe_combine_kernel's sums: chunk c of thread t is
// channels 4 (t + kThreads j), j < kVec), then, when norm_w is not null, the next norm of the updated
// row (row_norm.cuh: rmsnorm's bits) into o's row t (its q and scales at row t too). Every load is
// issued before the first store (a store to x would keep the next chunk's loads waiting). kDependent:
// a programmatic dependent (the decode MoE), which reads the pairs (written two launches back) before
// its wait and x and the expert rows after; otherwise x is read first, beside the pairs.
template <typename T, typename E, int kVec, bool kDependent>
__global__ void __launch_bounds__(kThreads) combine_rmsnorm_kernel(row_norm::RowOut<T> o, float* x, const E* expert_out,
                                                                   const int32_t* dest_row, const float* topk_w,
                                                                   const float* norm_w, int top_k, int64_t hidden,
                                                                   float eps) {
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + t * hidden);
  const int chunks = int(hidden / 4);
  float4 v[kVec];
  auto load_x = [&] {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (threadIdx.x + j * kThreads < chunks) v[j] = xr[threadIdx.x + j * kThreads];
  };
  if constexpr (!kDependent) load_x();
  sorted_pairs(s_row, s_w, dest_row, topk_w, t, top_k);
  if constexpr (kDependent) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    load_x();
  }
  float4 acc[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k = 0; k < top_k; ++k) {  // per value, the pairs' products in order, as moe_combine
    if (s_row[k] < 0) continue;
    const E* row = expert_out + int64_t(s_row[k]) * hidden;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int c = threadIdx.x + j * kThreads;
      if (c < chunks) {
        const float4 y = load4(row + 4 * int64_t(c));
        acc[j].x += y.x * s_w[k];
        acc[j].y += y.y * s_w[k];
        acc[j].z += y.z * s_w[k];
        acc[j].w += y.w * s_w[k];
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      v[j].x += acc[j].x, v[j].y += acc[j].y, v[j].z += acc[j].z, v[j].w += acc[j].w;
      xr[c] = v[j];
      ss = row_norm::add_squares(ss, v[j]);
    }
  }
  if (norm_w == nullptr) return;
  const float inv = row_norm::inv_rms(ss, scratch, hidden, eps);
  if (o.out) o.out += t * hidden;
  if (o.q) o.q += t * (hidden / 4), o.scales += t;
  row_norm::write_row<T, kVec>(o, v, chunks, norm_w, inv, scratch);
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
    add_into(xr + c, acc);
  }
}

}  // namespace

void moe_combine_fp8_scaled(float* x, const __nv_bfloat16* expert_out, const int32_t* dest_row, const float* weights,
                            const float* act_scales, const float* w2_scales, const int32_t* offsets,
                            int64_t n_tokens, int64_t n_experts, int64_t top_k, int64_t hidden, int64_t inter,
                            cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK && n_experts >= 1 && n_experts < (int64_t(1) << 31) &&
                 hidden % 8 == 0 && inter % 128 == 0 && aligned16(x) && aligned16(expert_out) && aligned16(w2_scales),
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
  if (hidden % V == 0 && reinterpret_cast<uintptr_t>(expert_out) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    moe_combine_kernel<T, V><<<unsigned(n_tokens), kThreads, 0, stream>>>(x, expert_out, dest_row, topk_w,
                                                                          int(top_k), hidden);
  else
    moe_combine_kernel<T, 1><<<unsigned(n_tokens), kThreads, 0, stream>>>(x, expert_out, dest_row, topk_w,
                                                                          int(top_k), hidden);
  CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

bool moe_combine_norm_fits(int64_t hidden) { return hidden % 4 == 0 && hidden <= int64_t(kThreads) * 4 * kMaxVec; }

template <typename T>
void moe_combine_rmsnorm(T* out, float* x, const float* expert_out, const int32_t* dest_row, const float* weights,
                         const float* norm_weight, int64_t n_tokens, int64_t top_k, int64_t hidden, float eps,
                         cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK, "moe_combine_rmsnorm: top_k ", top_k, " (at most ", kMaxTopK, ")");
  LFM2_CHECK(moe_combine_norm_fits(hidden) && aligned16(x) && aligned16(expert_out) &&
                 (norm_weight == nullptr || (reinterpret_cast<uintptr_t>(norm_weight) % 16 == 0 &&
                                             reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0)),
             "moe_combine_rmsnorm: hidden ", hidden, " (a multiple of 4, at most ", kThreads * 4 * kMaxVec,
             ") or unaligned buffers");
  if (n_tokens == 0) return;
  const row_norm::RowOut<T> o{out, nullptr, nullptr, 0, false};
  auto kernel = row_norm::short_row(hidden) ? combine_rmsnorm_kernel<T, float, 2, true>
                                            : combine_rmsnorm_kernel<T, float, kMaxVec, true>;
  launch_pdl(kernel, dim3(unsigned(n_tokens)), dim3(kThreads), 0, stream, true, o, x, expert_out, dest_row, weights,
             norm_weight, int(top_k), hidden, eps);
  CUDA_CHECK_LAUNCH("combine_rmsnorm_kernel");
}

template <typename T, typename E>
void moe_combine_norm(float* x, const E* expert_out, const int32_t* dest_row, const float* weights, int64_t n_tokens,
                      int64_t top_k, int64_t hidden, const NextNorm<T>& next, cudaStream_t stream) {
  LFM2_CHECK(top_k >= 1 && top_k <= kMaxTopK, "moe_combine_norm: top_k ", top_k, " (at most ", kMaxTopK, ")");
  LFM2_CHECK(moe_combine_norm_fits(hidden) && (next.q == nullptr || hidden % 128 == 0) && aligned16(x) &&
                 aligned16(next.weight) && reinterpret_cast<uintptr_t>(expert_out) % 8 == 0 &&
                 reinterpret_cast<uintptr_t>(next.out) % (4 * sizeof(T)) == 0 &&
                 reinterpret_cast<uintptr_t>(next.q) % 4 == 0,
             "moe_combine_norm: hidden ", hidden, " (a multiple of 4, at most ", kThreads * 4 * kMaxVec,
             "; of 128 with e4m3 codes) or unaligned buffers");
  if (n_tokens == 0) return;
  const row_norm::RowOut<T> o{next.out, reinterpret_cast<uint32_t*>(next.q), next.scales, n_tokens, next.per_row};
  auto kernel = row_norm::short_row(hidden) ? combine_rmsnorm_kernel<T, E, 2, false>
                                            : combine_rmsnorm_kernel<T, E, kMaxVec, false>;
  kernel<<<unsigned(n_tokens), kThreads, 0, stream>>>(o, x, expert_out, dest_row, weights, next.weight, int(top_k),
                                                      hidden, next.eps);
  CUDA_CHECK_LAUNCH("combine_rmsnorm_kernel (prompt rows)");
}

#define INST(T)                                                                                                     \
  template void moe_combine<T>(float*, const T*, const int32_t*, const float*, int64_t, int64_t, int64_t,         \
                               cudaStream_t);                                                                     \
  template void moe_combine_norm<T, T>(float*, const T*, const int32_t*, const float*, int64_t, int64_t, int64_t, \
                                       const NextNorm<T>&, cudaStream_t);                                         \
  template void moe_combine_rmsnorm<T>(T*, float*, const float*, const int32_t*, const float*, const float*,      \
                                       int64_t, int64_t, int64_t, float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST
template void moe_combine_norm<__half, __nv_bfloat16>(float*, const __nv_bfloat16*, const int32_t*, const float*,
                                                      int64_t, int64_t, int64_t, const NextNorm<__half>&,
                                                      cudaStream_t);

}  // namespace lfm2::cuda
