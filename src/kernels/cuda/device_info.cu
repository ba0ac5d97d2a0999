// The per-device property cache of device_info.h.
#include "kernels/cuda/device_info.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <cuda_runtime.h>

#include "common/cuda_check.h"

namespace lfm2::cuda {

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;  // never shrinks: references stay valid
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceInfo info;
  CUDA_CHECK(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, device));
  int clock_khz = 0, bus_bits = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  info.peak_dram_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9;
  return cache.emplace(device, info).first->second;
}

namespace {
std::mutex g_reserved_mutex;
std::map<int, int> g_reserved;  // device -> SMs reserved
}  // namespace

void reserve_sms(int device, int n) {
  std::lock_guard<std::mutex> lock(g_reserved_mutex);
  g_reserved[device] = n;
}

int compute_sms(int device) {
  const int all = device_info(device).sm_count;
  std::lock_guard<std::mutex> lock(g_reserved_mutex);
  auto it = g_reserved.find(device);
  const int reserved = it == g_reserved.end() ? 0 : it->second;
  return std::max(1, all - reserved);
}

namespace {
// cudaFuncSetAttribute once per (kernel, device, attribute, value); a set lookup afterwards.
void set_attribute_once(const void* kernel, cudaFuncAttribute attr, int value) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, int, int>> done;
  const auto key = std::make_tuple(kernel, current_device(), int(attr), value);
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(key)) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, attr, value));
  done.insert(key);
}
}  // namespace

void raise_smem_limit(const void* kernel, int bytes) {
  set_attribute_once(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

void prefer_all_shared(const void* kernel) {
  set_attribute_once(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
}

}  // namespace lfm2::cuda
