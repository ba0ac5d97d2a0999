// CUPTI's kernel records for the stage benchmarks (cuda_bench_step, not tests): the kernels a piece
// of queued work ran, in start order, and their summary (span, busy time, the gaps between kernels,
// the time per kernel name) with the Chrome trace-event JSON of the whole. Link CUDA::cupti.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cupti.h>

#include "common/cuda_check.h"

namespace lfm2::bench {

// CUPTI's kernel records (start, end in ns; name) of what ran while tracing was on.
struct KernelRecord {
  uint64_t start, end;
  std::string name;
};
inline std::vector<KernelRecord> g_kernels;

inline void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(16) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

inline void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_kernels.push_back({k->start, k->end, k->name ? k->name : "?"});
    }
  std::free(buffer);
}

#define CUPTI_CHECK(x)                                                                       \
  do {                                                                                       \
    const CUptiResult r_ = (x);                                                              \
    if (r_ != CUPTI_SUCCESS) throw std::runtime_error(std::string("CUPTI error at ") + #x);  \
  } while (0)

// The kernels of `run` (queued and finished inside it), in start order.
template <typename Run>
std::vector<KernelRecord> trace_kernels(Run&& run) {
  g_kernels.clear();
  CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  run();
  CUDA_CHECK(cudaDeviceSynchronize());
  CUPTI_CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_CHECK(cuptiActivityFlushAll(1));
  std::sort(g_kernels.begin(), g_kernels.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return a.start < b.start;
  });
  return g_kernels;
}

inline std::string short_name(const std::string& n) {
  std::string s = n.substr(0, n.find('('));
  if (s.size() > 60) s = s.substr(0, 60);
  return s;
}

// The trace's summary: span, busy (the union of the kernels' intervals), gaps (span - busy), the
// five longest gaps with the kernels around them; and the step as trace-event JSON.
inline void report_trace(const std::vector<KernelRecord>& k, const std::string& json_path, size_t top_n = 12) {
  if (k.empty()) return void(std::printf("trace: no kernel records\n"));
  uint64_t busy = 0, reach = k[0].start;
  struct Gap {
    uint64_t ns;
    size_t after;
  };
  std::vector<Gap> gaps;
  for (size_t i = 0; i < k.size(); ++i) {
    if (k[i].start > reach && i > 0) gaps.push_back({k[i].start - reach, i - 1});
    const uint64_t from = std::max(k[i].start, reach);
    if (k[i].end > from) busy += k[i].end - from;
    reach = std::max(reach, k[i].end);
  }
  const uint64_t span = reach - k[0].start;
  uint64_t gap_sum = 0;
  for (const Gap& g : gaps) gap_sum += g.ns;
  std::printf("trace: %zu kernels over %.3f ms: busy %.3f ms, idle between kernels %.1f us in %zu gaps "
              "(%.2f us each on average)\n",
              k.size(), span * 1e-6, busy * 1e-6, gap_sum * 1e-3, gaps.size(),
              gaps.empty() ? 0.0 : gap_sum * 1e-3 / double(gaps.size()));
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ns > b.ns; });
  for (size_t i = 0; i < std::min<size_t>(5, gaps.size()); ++i)
    std::printf("trace:   gap %.2f us after %s, before %s\n", gaps[i].ns * 1e-3,
                short_name(k[gaps[i].after].name).c_str(), short_name(k[gaps[i].after + 1].name).c_str());
  std::map<std::string, std::pair<int, uint64_t>> by_name;
  for (const KernelRecord& r : k) {
    auto& e = by_name[short_name(r.name)];
    ++e.first;
    e.second += r.end - r.start;
  }
  std::vector<std::pair<uint64_t, std::string>> top;
  for (const auto& [n, e] : by_name) top.push_back({e.second, n});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < std::min(top_n, top.size()); ++i)
    std::printf("trace:   %8.3f ms in %4d x %s\n", top[i].first * 1e-6, by_name[top[i].second].first,
                top[i].second.c_str());
  FILE* f = std::fopen(json_path.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "{\"traceEvents\": [\n");
  for (size_t i = 0; i < k.size(); ++i)
    std::fprintf(f, "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": 0, \"ts\": %.3f, \"dur\": %.3f}%s\n",
                 short_name(k[i].name).c_str(), (k[i].start - k[0].start) * 1e-3, (k[i].end - k[i].start) * 1e-3,
                 i + 1 < k.size() ? "," : "");
  std::fprintf(f, "], \"displayTimeUnit\": \"ms\"}\n");
  std::fclose(f);
  std::printf("trace: written to %s\n", json_path.c_str());
}

}  // namespace lfm2::bench
