// GPU discovery for lfm2-rank: how many GPUs a rank sees, and one GPU's name, uuid and memory.
// Declared without CUDA headers; defined in gpu_info.cpp, built only with the CUDA backend.
#pragma once

#include <cstdint>
#include <string>

namespace lfm2 {

// GPUs this process can see (CUDA_VISIBLE_DEVICES applies); 0 when there is no driver or no GPU.
int visible_gpu_count();

struct GpuInfo {
  int device = -1;
  std::string name;        // "NVIDIA H200"
  unsigned char uuid[16];  // cudaDeviceProp::uuid: the same physical GPU has the same uuid in every process
  int64_t free_bytes = 0, total_bytes = 0;
  std::string uuid_string() const;  // "GPU-1a2b3c4d-..." as nvidia-smi prints it
};

// Properties and current free memory of `device` (makes it this thread's current device).
GpuInfo gpu_info(int device);

// The device's copy bandwidth in bytes/s: device-to-device copies of `bytes` (read + written, the
// best of five), the rate generation's memory floor is measured against (--benchmark).
double copy_bandwidth(int device, int64_t bytes = int64_t(256) << 20);

}  // namespace lfm2
