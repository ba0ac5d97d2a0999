// GPU discovery for lfm2-rank: how many GPUs a rank sees, and one GPU's name, uuid and memory.
#include <cstdio>
#include <cstring>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "rank/startup/gpu_info.h"

namespace lfm2 {

int visible_gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here, the caller decides
    return 0;
  }
  return n;
}

std::string GpuInfo::uuid_string() const {
  char buf[48];
  const unsigned char* u = uuid;
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

double copy_bandwidth(int device, int64_t bytes) {
  CUDA_CHECK(cudaSetDevice(device));
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, size_t(bytes)) != cudaSuccess || cudaMalloc(&b, size_t(bytes)) != cudaSuccess) {
    cudaGetLastError();
    if (a) cudaFree(a);
    return 0;  // no room: no floor
  }
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaMemcpy(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));  // warm-up
  float best = 1e30f;
  for (int k = 0; k < 5; ++k) {
    CUDA_CHECK(cudaEventRecord(e0));
    CUDA_CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = ms < best ? ms : best;
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  return best > 0 ? 2.0 * double(bytes) / (double(best) * 1e-3) : 0;
}

GpuInfo gpu_info(int device) {
  GpuInfo g;
  g.device = device;
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  g.name = p.name;
  std::memcpy(g.uuid, p.uuid.bytes, sizeof g.uuid);
  CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  g.free_bytes = int64_t(free_b);
  g.total_bytes = int64_t(total_b);
  return g;
}

}  // namespace lfm2
