// One cuBLASLt handle per device for the whole process, with one fixed workspace, so that a matrix
// product never allocates. cublas_prepare() creates them up front (call it while allocating a
// stage's buffers); cublaslt_handle() / cublas_workspace() return them for the current device.
#pragma once

#include <cstddef>

#include <cublasLt.h>

namespace lfm2::cuda {

void cublas_prepare();                 // for the current device; idempotent
cublasLtHandle_t cublaslt_handle();    // for the current device (prepares it on first use)
void* cublas_workspace();              // the device's workspace, kCublasWorkspaceBytes
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

}  // namespace lfm2::cuda
