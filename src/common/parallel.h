// parallel_for: a static split of [0, n) into contiguous chunks, one std::thread per chunk.
//
// Determinism rule for every CPU op: an output element is computed by exactly one thread, with
// the same arithmetic whatever the split, so results are bit-identical for any thread count.
// Reductions are never split across threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/error.h"

namespace lfm2 {

// n_threads <= 0 means the hardware concurrency.
inline int resolve_threads(int n_threads) {
  if (n_threads > 0) return n_threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// The most threads a --threads option may ask for: far beyond any useful count, far below what a
// machine refuses to start.
inline constexpr int kMaxThreads = 1024;

// Calls f(begin, end, worker) on at most n_threads contiguous chunks of [0, n); worker is in
// [0, n_threads) and indexes per-thread scratch. Chunks hold at least min_chunk items, so small
// jobs run inline on the calling thread. The first exception thrown by a worker is rethrown; a
// thread the system refuses to start becomes an lfm2::Error once the started ones have finished.
template <typename F>
void parallel_for(int64_t n, int n_threads, F&& f, int64_t min_chunk = 1) {
  if (n <= 0) return;
  int64_t workers = std::min<int64_t>(resolve_threads(n_threads), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (workers <= 1) {
    f(int64_t(0), n, 0);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(workers));
  threads.reserve(size_t(workers - 1));
  auto run = [&](int64_t w) {
    int64_t begin = n * w / workers, end = n * (w + 1) / workers;
    try {
      f(begin, end, int(w));
    } catch (...) {
      errors[size_t(w)] = std::current_exception();
    }
  };
  std::string refused;
  for (int64_t w = 1; w < workers && refused.empty(); ++w) {
    try {
      threads.emplace_back(run, w);
    } catch (const std::system_error& e) {
      refused = cat("cannot start thread ", w + 1, " of ", workers, ": ", e.code().message());
    }
  }
  if (refused.empty()) run(0);
  for (auto& t : threads) t.join();
  if (!refused.empty()) throw Error(refused + " (ask for fewer threads)");
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lfm2
