// cpu::fp8_dequantize_mats on the GPU, rounded to T: each element T(float(q) * scale), the fp32
// product the host's dequantization makes (model/weight_upload.cpp), so a GEMM over this output
// computes what it computed over weights dequantized at upload. e4m3 -> fp16 -> fp32 is exact.
#include <cuda_fp8.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_ops.h"

namespace lfm2::cuda {
namespace {

__device__ __forceinline__ float e4m3_value(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3)));
}

// V consecutive columns per thread (16: one 16-byte load; they share a scale, 16 divides 128).
template <typename T, int V>
__global__ void fp8_dequantize_kernel(T* out, const uint8_t* q, const float* scale, bool block, int64_t n_mats,
                                      int64_t rows, int64_t cols, int64_t scale_rows, int64_t scale_cols) {
  const int64_t groups = cols / V, per_mat = rows * groups, n = n_mats * per_mat;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / per_mat, rem = i - m * per_mat, r = rem / groups, c = (rem - r * groups) * V;
    const float s = block ? scale[(m * scale_rows + r / 128) * scale_cols + c / 128] : scale[m * rows + r];
    const int64_t at = (m * rows + r) * cols + c;
    alignas(16) uint8_t b[V];
    alignas(16) T o[V];
    if constexpr (V == 16)
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(q + at);
    else
      b[0] = q[at];
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = from_f32<T>(e4m3_value(b[j]) * s);
    if constexpr (V == 16) {
#pragma unroll
      for (int j = 0; j < int(V * sizeof(T) / 16); ++j)
        reinterpret_cast<uint4*>(out + at)[j] = reinterpret_cast<const uint4*>(o)[j];
    } else {
      out[at] = o[0];
    }
  }
}

}  // namespace

template <typename T>
void fp8_dequantize(T* out, const uint8_t* q, const float* scale, Fp8Scheme scheme, int64_t n_mats, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  const int64_t n = n_mats * rows * cols;
  if (n == 0) return;
  const bool block = scheme == Fp8Scheme::Block128;
  const int64_t sr = fp8_scale_rows(scheme, rows), sc = fp8_scale_cols(scheme, cols);
  const bool wide = cols % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (wide)
    fp8_dequantize_kernel<T, 16><<<grid_for(n / 16, 256 * 4), 256, 0, stream>>>(out, q, scale, block, n_mats, rows,
                                                                               cols, sr, sc);
  else
    fp8_dequantize_kernel<T, 1><<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, q, scale, block, n_mats, rows, cols,
                                                                         sr, sc);
  CUDA_CHECK_LAUNCH("fp8_dequantize_kernel");
}

template void fp8_dequantize<float>(float*, const uint8_t*, const float*, Fp8Scheme, int64_t, int64_t, int64_t,
                                    cudaStream_t);
template void fp8_dequantize<__nv_bfloat16>(__nv_bfloat16*, const uint8_t*, const float*, Fp8Scheme, int64_t,
                                            int64_t, int64_t, cudaStream_t);
template void fp8_dequantize<__half>(__half*, const uint8_t*, const float*, Fp8Scheme, int64_t, int64_t, int64_t,
                                     cudaStream_t);

}  // namespace lfm2::cuda
