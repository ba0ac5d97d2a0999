// RMSNorm on the GPU, with the residual add fused in (add_rmsnorm), a last-token variant for the
// head, and one that also quantizes its output to e4m3 (rmsnorm_quantize_e4m3: an FP8 product's
// input). One block per row; sum of squares in fp32 with a fixed reduction order.
#include <cuda_fp8.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 256;

// kAdd: x += delta first (x written back). Row r of `in` is r * in_step + in_offset, or with
// lengths r * in_step + lengths[r] - 1 (each sequence's own last position).
template <typename T, bool kAdd>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(T* out, float* x, const T* delta, const float* weight,
                                                           int64_t dim, float eps, int64_t in_step,
                                                           int64_t in_offset, const int32_t* lengths) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float* xr = x + (r * in_step + (lengths ? int64_t(lengths[r]) - 1 : in_offset)) * dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += to_f32(delta[r * dim + i]);
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) out[r * dim + i] = from_f32<T>(weight[i] * (xr[i] * inv));
}

// One pass for rows of at most kThreads * 4 * kMaxVec floats, 16-byte aligned: each thread keeps
// its float4 chunks in registers between the sum and the scaling (no second read of x).
constexpr int kMaxVec = 8;

template <typename T, bool kAdd>
__global__ void __launch_bounds__(kThreads) rmsnorm_vec_kernel(T* out, float* x, const T* delta, const float* weight,
                                                               int64_t dim, float eps, int64_t in_step,
                                                               int64_t in_offset, const int32_t* lengths) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + (r * in_step + (lengths ? int64_t(lengths[r]) - 1 : in_offset)) * dim);
  const int chunks = int(dim / 4);
  float4 v[kMaxVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      v[j] = xr[c];
      if constexpr (kAdd) {
        const T* d = delta + r * dim + 4 * int64_t(c);
        v[j].x += to_f32(d[0]), v[j].y += to_f32(d[1]), v[j].z += to_f32(d[2]), v[j].w += to_f32(d[3]);
        xr[c] = v[j];
      }
      ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      const float4 w = w4[c];
      alignas(16) T o[4] = {from_f32<T>(w.x * (v[j].x * inv)), from_f32<T>(w.y * (v[j].y * inv)),
                            from_f32<T>(w.z * (v[j].z * inv)), from_f32<T>(w.w * (v[j].w * inv))};
      T* dst = out + r * dim + 4 * int64_t(c);
      if constexpr (sizeof(T) == 4)
        *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(o);
      else
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(o);
    }
  }
}

constexpr float kE4m3MaxF = 448.0f;  // largest finite e4m3

__device__ __forceinline__ float block_max(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // scratch may still be read by block_sum
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = int(threadIdx.x & 31) < int(blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// Four e4m3 codes of v / s (RNE, saturating: moe_quantize_e4m3's conversion) in one word.
__device__ __forceinline__ uint32_t e4m3x4(const float4& v, float s) {
  auto code = [s](float f) { return uint32_t(__nv_cvt_float_to_fp8(f / s, __NV_SATFINITE, __NV_E4M3)); };
  return code(v.x) | code(v.y) << 8 | code(v.z) << 16 | code(v.w) << 24;
}

// rmsnorm_vec_kernel's norm, then the T outputs (widened back) quantized from registers: dim % 128
// == 0, so a warp's 32 float4 chunks of step j are one 128-column group (g = 8 j + warp), and every
// warp is wholly inside the row or past it (the shuffles stay converged).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_e4m3_kernel(T* out, uint8_t* q, float* scales, const float* x, const float* weight, int64_t dim,
                        float eps, int64_t first_q, int64_t q_rows, bool per_row) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + r * dim);
  const int chunks = int(dim / 4);
  float4 v[kMaxVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      v[j] = xr[c];
      ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      const float4 w = w4[c];
      alignas(8) T t[4] = {from_f32<T>(w.x * (v[j].x * inv)), from_f32<T>(w.y * (v[j].y * inv)),
                           from_f32<T>(w.z * (v[j].z * inv)), from_f32<T>(w.w * (v[j].w * inv))};
      *reinterpret_cast<uint2*>(out + r * dim + 4 * int64_t(c)) = *reinterpret_cast<const uint2*>(t);
      v[j] = make_float4(to_f32(t[0]), to_f32(t[1]), to_f32(t[2]), to_f32(t[3]));  // the T outputs, in place
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
    }
  }
  if (r < first_q) return;  // a decode row: not quantized (block-uniform)
  const int64_t qr = r - first_q;
  uint32_t* qrow = reinterpret_cast<uint32_t*>(q + qr * dim);
  if (per_row) {
    amax = block_max(amax, scratch);
    const float s = amax > 0 ? amax / kE4m3MaxF : 1.0f;
#pragma unroll
    for (int j = 0; j < kMaxVec; ++j) {
      const int c = threadIdx.x + j * kThreads;
      if (c < chunks) qrow[c] = e4m3x4(v[j], s);
    }
    for (int64_t g = threadIdx.x; g < dim / 128; g += kThreads) scales[g * q_rows + qr] = s;
    return;
  }
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c >= chunks) continue;
    float m = fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w)));
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
    const float s = m > 0 ? m / kE4m3MaxF : 1.0f;
    qrow[c] = e4m3x4(v[j], s);
    if ((threadIdx.x & 31) == 0) scales[int64_t(c / 32) * q_rows + qr] = s;
  }
}

template <typename T, bool kAdd>
void launch(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
            int64_t in_step, int64_t in_offset, const int32_t* lengths, cudaStream_t stream) {
  const bool vec = dim % 4 == 0 && dim <= int64_t(kThreads) * 4 * kMaxVec &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0;
  if (vec)
    rmsnorm_vec_kernel<T, kAdd><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps, in_step,
                                                                           in_offset, lengths);
  else
    rmsnorm_kernel<T, kAdd><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps, in_step,
                                                                       in_offset, lengths);
}

}  // namespace

template <typename T>
void rmsnorm(T* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             cudaStream_t stream) {
  if (n_rows == 0) return;
  launch<T, false>(out, const_cast<float*>(in), nullptr, weight, n_rows, dim, eps, 1, 0, nullptr, stream);
  CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

template <typename T>
void add_rmsnorm(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 cudaStream_t stream) {
  if (n_rows == 0) return;
  launch<T, true>(out, x, delta, weight, n_rows, dim, eps, 1, 0, nullptr, stream);
  CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

template <typename T>
void rmsnorm_last(T* out, const float* in, const float* weight, int64_t n_seq, int64_t seq_len, int64_t dim,
                  float eps, cudaStream_t stream, const int32_t* lengths) {
  if (n_seq == 0) return;
  launch<T, false>(out, const_cast<float*>(in), nullptr, weight, n_seq, dim, eps, seq_len, seq_len - 1, lengths,
                   stream);
  CUDA_CHECK_LAUNCH("rmsnorm_last_kernel");
}

template <typename T>
void rmsnorm_quantize_e4m3(T* out, uint8_t* q, float* scales, const float* in, const float* weight, int64_t n_rows,
                           int64_t first_q, int64_t dim, float eps, bool per_row, cudaStream_t stream) {
  LFM2_CHECK(dim % 128 == 0 && dim <= int64_t(kThreads) * 4 * kMaxVec && first_q >= 0 && first_q <= n_rows,
             "rmsnorm_quantize_e4m3: dim ", dim, " (a multiple of 128, at most ", kThreads * 4 * kMaxVec,
             "), rows quantized from ", first_q, " of ", n_rows);
  LFM2_CHECK(reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0,
             "rmsnorm_quantize_e4m3: aligned rows (in and weight 16 bytes, out 8, q 4)");
  if (n_rows == 0) return;
  rmsnorm_e4m3_kernel<T><<<unsigned(n_rows), kThreads, 0, stream>>>(out, q, scales, in, weight, dim, eps, first_q,
                                                                    n_rows - first_q, per_row);
  CUDA_CHECK_LAUNCH("rmsnorm_e4m3_kernel");
}

template void rmsnorm_quantize_e4m3<__nv_bfloat16>(__nv_bfloat16*, uint8_t*, float*, const float*, const float*,
                                                   int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template void rmsnorm_quantize_e4m3<__half>(__half*, uint8_t*, float*, const float*, const float*, int64_t, int64_t,
                                            int64_t, float, bool, cudaStream_t);

#define INST(T)                                                                                                   \
  template void rmsnorm<T>(T*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);              \
  template void add_rmsnorm<T>(T*, float*, const T*, const float*, int64_t, int64_t, float, cudaStream_t);      \
  template void rmsnorm_last<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, float, cudaStream_t, \
                                const int32_t*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
