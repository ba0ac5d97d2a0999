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

}  // namespace

template <typename T>
void rmsnorm(T* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             cudaStream_t stream) {
  if (n_rows == 0) return;
  rmsnorm_kernel<T, false><<<unsigned(n_rows), kThreads, 0, stream>>>(out, const_cast<float*>(in), nullptr, weight,
                                                                      dim, eps, 1, 0, nullptr);
  CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

template <typename T>
void add_rmsnorm(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 cudaStream_t stream) {
  if (n_rows == 0) return;
  rmsnorm_kernel<T, true><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps, 1, 0, nullptr);
  CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

template <typename T>
void rmsnorm_last(T* out, const float* in, const float* weight, int64_t n_seq, int64_t seq_len, int64_t dim,
                  float eps, cudaStream_t stream, const int32_t* lengths) {
  if (n_seq == 0) return;
  rmsnorm_kernel<T, false><<<unsigned(n_seq), kThreads, 0, stream>>>(out, const_cast<float*>(in), nullptr, weight,
                                                                     dim, eps, seq_len, seq_len - 1, lengths);
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
