// One span of a stage's timeline (--trace): a compute step, a transfer or a host wait, in seconds
// from the run's origin. Transports record their transfers in it, the engine its steps and waits;
// report/trace_file.h writes every rank's spans as one Chrome trace.
#pragma once

#include <cstdint>
#include <string>

namespace lfm2 {

enum class Track { kCompute = 0, kRecv = 1, kSend = 2, kHost = 3 };

struct TraceSpan {
  Track track = Track::kCompute;
  std::string name;   // "forward", "recv", "wait send", ...
  int64_t micro = -1;  // microbatch, -1 for none
  double begin_s = 0, end_s = 0;
};

}  // namespace lfm2
