// Check macros for CUDA runtime, cuBLAS and NCCL calls, and for kernel launches.
//
// Each throws lfm2::Error (src/common/error.h) naming the file, line, the call and the library's
// message; none compiles to nothing. Setting LFM2_SYNC_CHECK=1 in the environment makes
// CUDA_CHECK_LAUNCH() also synchronise the device, so that an asynchronous fault is reported at
// the launch that caused it (debugging only: it serialises everything).
// Include only from CUDA-aware translation units (.cu files, or .cpp files linked to CUDA::cudart).
#pragma once

#include <cstdlib>
#include <cstring>

#include <cuda_runtime_api.h>

#include "common/error.h"

namespace lfm2 {

// True when LFM2_SYNC_CHECK is set to anything but "" or "0"; read once.
inline bool cuda_sync_check_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LFM2_SYNC_CHECK");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

inline const char* cublas_status_text(int status) {
  switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unknown)";
  }
}

}  // namespace lfm2

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    cudaError_t lfm2_cuda_err_ = (call);                                                              \
    if (lfm2_cuda_err_ != cudaSuccess)                                                                \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("CUDA error ", cudaGetErrorName(lfm2_cuda_err_), ": ",         \
                                      cudaGetErrorString(lfm2_cuda_err_)));                           \
  } while (0)

// After a kernel launch: the launch error, and with LFM2_SYNC_CHECK=1 the kernel's own fault.
// `what` names the kernel in the message.
#define CUDA_CHECK_LAUNCH(what)                                                                       \
  do {                                                                                                \
    cudaError_t lfm2_cuda_err_ = cudaGetLastError();                                                  \
    if (lfm2_cuda_err_ == cudaSuccess && ::lfm2::cuda_sync_check_enabled())                           \
      lfm2_cuda_err_ = cudaDeviceSynchronize();                                                       \
    if (lfm2_cuda_err_ != cudaSuccess)                                                                \
      ::lfm2::throw_error(__FILE__, __LINE__, ::lfm2::cat("launch of ", what),                       \
                          ::lfm2::cat("CUDA error ", cudaGetErrorName(lfm2_cuda_err_), ": ",         \
                                      cudaGetErrorString(lfm2_cuda_err_)));                           \
  } while (0)

// cuBLAS statuses are plain ints here so that this header does not need cublas_v2.h.
#define CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                \
    int lfm2_cublas_st_ = static_cast<int>(call);                                                     \
    if (lfm2_cublas_st_ != 0)                                                                         \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("cuBLAS error ", ::lfm2::cublas_status_text(lfm2_cublas_st_),  \
                                      " (", lfm2_cublas_st_, ")"));                                   \
  } while (0)

// NCCL: needs nccl.h included before use (ncclGetErrorString, ncclGetLastError).
#define NCCL_CHECK(call)                                                                              \
  do {                                                                                                \
    ncclResult_t lfm2_nccl_res_ = (call);                                                             \
    if (lfm2_nccl_res_ != ncclSuccess && lfm2_nccl_res_ != ncclInProgress)                            \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("NCCL error ", ncclGetErrorString(lfm2_nccl_res_), ": ",       \
                                      ncclGetLastError(nullptr)));                                    \
  } while (0)
