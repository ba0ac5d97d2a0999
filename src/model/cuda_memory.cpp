#include "model/cuda_memory.h"

#include <algorithm>
#include <cstring>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
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

void* pinned_alloc(int64_t bytes, int device) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    LFM2_FAIL("cannot allocate ", bytes >> 20, " MiB of pinned host memory for device ", device, ": ",
              cudaGetErrorString(err));
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

void StagingRing::allocate(int64_t chunk_bytes, int device) {
  release();
  chunk_ = DeviceBlocks::aligned(std::max<int64_t>(chunk_bytes, 1));
  const cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&base_), size_t(kChunks * chunk_), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    base_ = nullptr;
    LFM2_FAIL("cannot allocate ", (kChunks * chunk_) >> 10, " KiB of pinned staging for device ", device, ": ",
              cudaGetErrorString(err));
  }
  done_.assign(kChunks, nullptr);
  for (auto& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  used_.assign(kChunks, false);
  next_ = 0;
}

void StagingRing::copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  LFM2_CHECK(base_ && bytes <= chunk_, "staging: a copy of ", bytes, " bytes into chunks of ", chunk_);
  if (bytes <= 0) return;
  const int c = next_;
  next_ = (next_ + 1) % kChunks;
  if (used_[size_t(c)]) CUDA_CHECK(cudaEventSynchronize(done_[size_t(c)]));  // its last copy has run
  char* chunk = base_ + c * chunk_;
  std::memcpy(chunk, src, size_t(bytes));
  CUDA_CHECK(cudaMemcpyAsync(dst, chunk, size_t(bytes), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(done_[size_t(c)], stream));
  used_[size_t(c)] = true;
}

void StagingRing::release() {
  for (auto& e : done_)
    if (e) {
      cudaEventSynchronize(e);
      cudaEventDestroy(e);
    }
  done_.clear();
  used_.clear();
  if (base_) cudaFreeHost(base_);
  base_ = nullptr;
}

}  // namespace lfm2
