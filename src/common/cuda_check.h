// For CUDA-aware translation units (.cu files, or .cpp files linked to CUDA::cudart): the CUDA
// runtime's declarations and the project's check macros (CUDA_CHECK, CUDA_CHECK_LAUNCH,
// CUBLAS_CHECK, NCCL_CHECK: defined with all the others in common/error.h).
#pragma once

#include <cuda_runtime_api.h>

#include "common/error.h"
