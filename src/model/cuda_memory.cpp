#include "model/cuda_memory.h"

#include <algorithm>

#include <cuda_runtime_api.h>

#include "common/error.h"

namespace lfm2 {

void* device_alloc(int64_t bytes, const std::string& what, int device) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1)));
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    LFM2_FAIL("out of GPU memory allocating ", what, " (", bytes >> 20, " MiB) on device ", device, ": ",
              free_b >> 20, " MiB free of ", total_b >> 20, " MiB (", cudaGetErrorString(err), ")");
  }
  return p;
}

int64_t DeviceBlocks::reserve(int64_t bytes) {
  const int64_t offset = total_;
  total_ += aligned(bytes);
  return offset;
}

void DeviceBlocks::allocate(const std::string& what, int device) {
  LFM2_CHECK(!base_, "device blocks: ", what, " allocated twice");
  base_ = static_cast<char*>(device_alloc(total_, what, device));
}

void DeviceBlocks::release() {
  if (base_) cudaFree(base_);
  base_ = nullptr;
  total_ = 0;
}

}  // namespace lfm2
