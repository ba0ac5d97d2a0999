// Memory for the CUDA stage's rooms: a device allocation that names what it was for (and the free
// memory) when it fails, pinned host memory, DeviceBlocks (several blocks laid out in one device
// allocation) and StagingRing (small host-to-device copies in stream order).
#pragma once

#include <cstdint>
#include <string>

#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "common/align.h"
#include "common/dtype.h"

namespace lfm2 {

// cudaMalloc of max(bytes, 1) bytes; on failure the error names `what`, the device and its free memory.
void* device_alloc(int64_t bytes, const std::string& what, int device);
// cudaHostAlloc of max(bytes, 1) bytes of pinned host memory (for `device`'s copies); on failure the
// error names the bytes and the device. Freed with cudaFreeHost.
void* pinned_alloc(int64_t bytes, int device);

// Blocks of one device allocation: reserve() each in turn (256-byte aligned, so 16-byte loads and
// TMA see aligned rows), allocate() once, then at() each block's address.
class DeviceBlocks {
 public:
  static int64_t aligned(int64_t bytes) { return align_up(bytes); }

  DeviceBlocks() = default;
  DeviceBlocks(const DeviceBlocks&) = delete;
  DeviceBlocks& operator=(const DeviceBlocks&) = delete;
  ~DeviceBlocks() { release(); }

  int64_t reserve(int64_t bytes);  // the block's offset
  int64_t bytes() const { return total_; }
  void allocate(const std::string& what, int device);
  bool allocated() const { return base_ != nullptr; }
  char* base() const { return base_; }
  // The block at `offset` as U*; null for a negative offset (a block that was not reserved).
  template <typename U>
  U* at(int64_t offset) const {
    return offset < 0 ? nullptr : reinterpret_cast<U*>(base_ + offset);
  }
  // Frees the allocation and forgets the blocks (the caller has synchronised what used them).
  void release();

 private:
  int64_t total_ = 0;
  char* base_ = nullptr;
};

// Host-to-device copies of small descriptors in stream order (a step's PagedSeq array, block-table
// entries) through pinned staging: a ring of chunks, each reused only once the copy out of it has
// run (an event per chunk), so the host may queue many steps ahead without overwriting one whose
// copy is still waiting in the stream.
class StagingRing {
 public:
  static constexpr int kChunks = 64;

  StagingRing() = default;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing() { release(); }

  // Chunks of chunk_bytes each (the largest copy asked for); once, before the first copy.
  void allocate(int64_t chunk_bytes, int device);
  bool allocated() const { return base_ != nullptr; }
  // Queues dst (device) = src[0, bytes) on `stream`; src is copied into a chunk first.
  void copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream);
  void release();

 private:
  char* base_ = nullptr;  // pinned, kChunks * chunk_
  int64_t chunk_ = 0;
  std::vector<cudaEvent_t> done_;
  std::vector<bool> used_;
  int next_ = 0;
};

// The DType of a compute element type.
template <typename T>
DType dtype_of();
template <>
inline DType dtype_of<float>() { return DType::F32; }
template <>
inline DType dtype_of<__nv_bfloat16>() { return DType::BF16; }
template <>
inline DType dtype_of<__half>() { return DType::F16; }
template <>
inline DType dtype_of<uint8_t>() { return DType::E4M3; }  // an FP8 file's matrices, kept as stored

}  // namespace lfm2
