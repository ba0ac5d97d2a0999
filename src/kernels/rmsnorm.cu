// RMSNorm on the GPU, with the residual add fused in (add_rmsnorm) and a last-token variant for
// the head. One block per row; sum of squares in fp32 with a fixed reduction order.
#include "common/cuda_check.h"
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

#define INST(T)                                                                                                   \
  template void rmsnorm<T>(T*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);              \
  template void add_rmsnorm<T>(T*, float*, const T*, const float*, int64_t, int64_t, float, cudaStream_t);      \
  template void rmsnorm_last<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, float, cudaStream_t, \
                                const int32_t*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
