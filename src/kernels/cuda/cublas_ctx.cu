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
  void* decode = nullptr;  // kDecodeWorkspaceBytes of partials, then kDecodeCounters ints (zeroed)
};

void* device_alloc(size_t bytes, const char* what, int device) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    LFM2_FAIL("out of GPU memory allocating the ", what, " (", bytes >> 20, " MiB) on device ", device, ": ",
              free_b >> 20, " MiB free of ", total_b >> 20);
  }
  return p;
}

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
    c.workspace = device_alloc(kCublasWorkspaceBytes, "cuBLAS workspace", device);
    const size_t decode_bytes = kDecodeWorkspaceBytes + size_t(kDecodeCounters) * sizeof(int);
    c.decode = device_alloc(decode_bytes, "decode GEMM workspace", device);
    CUDA_CHECK(cudaMemset(c.decode, 0, decode_bytes));  // the counters start at zero
    CUDA_CHECK(cudaDeviceSynchronize());                 // before any (non-blocking) stream reads them
  }
  return c;
}

}  // namespace

void cublas_prepare() { get(current_device()); }
cublasLtHandle_t cublaslt_handle() { return get(current_device()).lt; }
void* cublas_workspace() { return get(current_device()).workspace; }

DecodeWorkspace decode_gemm_workspace() {
  DecodeWorkspace w;
  char* base = static_cast<char*>(get(current_device()).decode);
  w.partial = reinterpret_cast<float*>(base);
  w.partial_bytes = int64_t(kDecodeWorkspaceBytes);
  w.counters = reinterpret_cast<int*>(base + kDecodeWorkspaceBytes);
  w.n_counters = kDecodeCounters - 5 - kMoeReady;
  w.moe_ready = w.counters + kDecodeCounters - 5 - kMoeReady;
  w.moe_unit_counters = w.counters + kDecodeCounters - 5;
  w.route_counter = w.counters + kDecodeCounters - 1;
  return w;
}

}  // namespace lfm2::cuda
