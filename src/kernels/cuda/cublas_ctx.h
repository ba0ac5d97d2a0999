// One cuBLAS handle per device for the whole process, created once with its workspace, so that a
// matrix product never allocates. cublas_prepare() creates it up front (call it while allocating
// a stage's buffers); cublas_handle() returns it for the current device.
#pragma once

#include <cublas_v2.h>

namespace lfm2::cuda {

void cublas_prepare();             // for the current device; idempotent
cublasHandle_t cublas_handle();    // for the current device (prepares it on first use)

}  // namespace lfm2::cuda
