// The per-device cuBLASLt handle and its fixed workspace (see cublas_ctx.h).
#include "kernels/cuda/cublas_ctx.h"

#include <map>
#include <mutex>

#include "common/cuda_check.h"
#include "kernels/cuda/device_info.h"

namespace lfm2::cuda {
namespace {

struct Ctx {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
};

std::mutex g_mutex;
std::map<int, Ctx>& contexts() {
  static std::map<int, Ctx> m;  // never destroyed: handles live until the process ends
  return m;
}

Ctx& get(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Ctx& c = contexts()[device];
  if (c.lt == nullptr) {
    CUBLAS_CHECK(cublasLtCreate(&c.lt));
    cudaError_t err = cudaMalloc(&c.workspace, kCublasWorkspaceBytes);
    if (err != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      LFM2_FAIL("out of GPU memory allocating the cuBLAS workspace (", kCublasWorkspaceBytes >> 20,
                " MiB) on device ", device, ": ", free_b >> 20, " MiB free of ", total_b >> 20);
    }
  }
  return c;
}

}  // namespace

void cublas_prepare() { get(current_device()); }
cublasLtHandle_t cublaslt_handle() { return get(current_device()).lt; }
void* cublas_workspace() { return get(current_device()).workspace; }

}  // namespace lfm2::cuda
