// Seconds on the steady (monotonic) clock: for durations and timelines, never for dates.
#pragma once

#include <chrono>

namespace lfm2 {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace lfm2
