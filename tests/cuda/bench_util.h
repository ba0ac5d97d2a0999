// What the kernel benchmarks (cuda_bench_*, not tests) share: timing by CUDA events, device
// buffers, random inputs, and the memory floor measured as the device-to-device copy bandwidth.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/ops.h"

namespace lfm2::bench {

// Median over 5 batches of the mean time per call, each batch `reps` calls queued back to back
// between two events (no host synchronisation inside a batch, so the host's launch work overlaps
// the device's execution and is not counted, as in a pipeline); 3 calls of warm-up first.
inline double median_ms(cudaStream_t s, const std::function<void()>& f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int batch = 0; batch < 5; ++batch) {
    CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; ++i) f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / float(reps));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* dev_alloc(int64_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  return p;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = dev_alloc<T>(int64_t(h.size()));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// n values uniform in (-scale, scale), keyed by (stream 99, seed, index).
inline std::vector<float> rand_host(int64_t n, uint64_t seed, float scale) {
  std::vector<float> h(static_cast<size_t>(n));
  CounterRng rng(99, seed);
  for (int64_t i = 0; i < n; ++i) h[size_t(i)] = float(rng.symmetric(uint64_t(i))) * scale;
  return h;
}

// rand_host's values on the device in T.
template <typename T>
T* rand_dev(int64_t n, uint64_t seed, float scale) {
  float* tmp = upload(rand_host(n, seed, scale));
  T* d = dev_alloc<T>(n);
  cuda::convert_from_f32(d, tmp, n, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(tmp);
  return d;
}

// The device-to-device copy bandwidth (GB/s, read + write bytes over time), measured by bench_copy.
inline double g_copy_gbs = 0;

inline void bench_copy(cudaStream_t s) {
  const int64_t n = int64_t(1) << 30;
  char *a = dev_alloc<char>(n), *b = dev_alloc<char>(n);
  CUDA_CHECK(cudaMemset(a, 1, size_t(n)));
  const double t = median_ms(s, [&] { CUDA_CHECK(cudaMemcpyAsync(b, a, size_t(n), cudaMemcpyDeviceToDevice, s)); }, 5);
  g_copy_gbs = 2.0 * double(n) / t * 1e-6;
  std::printf("copy  1 GiB device to device: %.3f ms, %.0f GB/s (the floor's bandwidth below; the DRAM's peak %.0f)\n",
              t, g_copy_gbs, cuda::device_info(cuda::current_device()).peak_dram_gbs);
  cudaFree(a), cudaFree(b);
}

// "0.123 ms  2712 GB/s  88% of floor (0.108)" for `bytes` that must move, at bench_copy's bandwidth.
inline std::string bw(double bytes, double ms) {
  char b[128];
  const double floor_ms = bytes / g_copy_gbs * 1e-6;
  std::snprintf(b, sizeof b, "%7.4f ms %5.0f GB/s %4.0f%% of floor (%.4f)", ms, bytes / ms * 1e-6,
                100 * floor_ms / ms, floor_ms);
  return b;
}

}  // namespace lfm2::bench
