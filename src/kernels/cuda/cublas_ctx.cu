// The per-device cuBLAS handle and its fixed workspace (see cublas_ctx.h).
#include "kernels/cuda/cublas_ctx.h"

#include <map>
#include <mutex>

#include "common/cuda_check.h"

namespace lfm2::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's own recommendation for Hopper

struct Ctx {
  cublasHandle_t handle = nullptr;
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
  if (c.handle == nullptr) {
    CUBLAS_CHECK(cublasCreate(&c.handle));
    cudaError_t err = cudaMalloc(&c.workspace, kWorkspaceBytes);
    if (err != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      LFM2_FAIL("out of GPU memory allocating the cuBLAS workspace (", kWorkspaceBytes >> 20, " MiB) on device ",
                device, ": ", free_b >> 20, " MiB free of ", total_b >> 20);
    }
    CUBLAS_CHECK(cublasSetWorkspace(c.handle, c.workspace, kWorkspaceBytes));
    CUBLAS_CHECK(cublasSetPointerMode(c.handle, CUBLAS_POINTER_MODE_HOST));
  }
  return c;
}

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

void cublas_prepare() { get(current_device()); }
cublasHandle_t cublas_handle() { return get(current_device()).handle; }

}  // namespace lfm2::cuda
