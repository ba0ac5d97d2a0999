// Linear layers on the GPU through cuBLAS (cublasGemmEx): out = in W^T with fp32 accumulation.
// fp32 runs with CUBLAS_COMPUTE_32F (exact fp32, no TF32) unless tf32 is asked for; bf16 and fp16
// run on the tensor cores. Row-major out (n_rows, n_out) is column-major out^T = W in^T.
#include "common/cuda_check.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

template <typename T>
cudaDataType_t data_type();
template <>
cudaDataType_t data_type<float>() { return CUDA_R_32F; }
template <>
cudaDataType_t data_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
cudaDataType_t data_type<__half>() { return CUDA_R_16F; }

template <typename T>
void gemm(void* out, cudaDataType_t out_type, const T* in, const T* weight, int64_t n_rows, int64_t n_in,
          int64_t n_out, cudaStream_t stream, bool tf32) {
  if (n_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31) && n_in < (int64_t(1) << 31) && n_out < (int64_t(1) << 31),
             "linear: sizes ", n_rows, "x", n_in, "x", n_out, " too large for cuBLAS");
  cublasHandle_t h = cublas_handle();
  CUBLAS_CHECK(cublasSetStream(h, stream));
  const float alpha = 1.f, beta = 0.f;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (std::is_same<T, float>::value && tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n_out), int(n_rows), int(n_in), &alpha, weight,
                            data_type<T>(), int(n_in), in, data_type<T>(), int(n_in), &beta, out, out_type,
                            int(n_out), compute, CUBLAS_GEMM_DEFAULT));
  if (cuda_sync_check_enabled()) CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

template <typename T>
void linear(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream,
            bool tf32) {
  gemm<T>(out, data_type<T>(), in, weight, n_rows, n_in, n_out, stream, tf32);
}

template <typename T>
void linear_f32out(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32) {
  gemm<T>(out, CUDA_R_32F, in, weight, n_rows, n_in, n_out, stream, tf32);
}

#define INST(T)                                                                                         \
  template void linear<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);      \
  template void linear_f32out<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
