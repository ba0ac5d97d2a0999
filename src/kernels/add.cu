// Residual add on the GPU: out = a + b, fp32 residual plus a delta of any element type.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

template <typename T>
__global__ void add_kernel(float* out, const float* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + to_f32(b[i]);
}

template <typename T>
__global__ void convert_kernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(in[i]);
}

}  // namespace

template <typename T>
void add(float* out, const float* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH("add_kernel");
}

template <typename T>
void convert_from_f32(T* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH("convert_kernel");
}

#define INST(T)                                                                 \
  template void add<T>(float*, const float*, const T*, int64_t, cudaStream_t); \
  template void convert_from_f32<T>(T*, const float*, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
