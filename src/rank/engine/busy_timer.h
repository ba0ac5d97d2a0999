// How the pipeline measures a stage's busy time where its work is only queued (a GPU): the device
// path brackets each step with begin()/end() instead of synchronising after it.
#pragma once

#include <cstdint>
#include <vector>

#include "rank/transport/trace_span.h"

namespace lfm2 {

// Busy time of an executor whose work is asynchronous: begin()/end() bracket one step's queued work;
// busy_s() (after the run) waits for it and returns the sum since reset(); spans() then gives each
// step's span in seconds from reset().
class BusyTimer {
 public:
  virtual ~BusyTimer() = default;
  virtual void reset() = 0;
  virtual void begin(const char* what, int64_t micro) = 0;
  virtual void end() = 0;
  virtual double busy_s() = 0;
  virtual std::vector<TraceSpan> spans() = 0;
  // Steps ended since reset(), and whether step k (0-based, in that order) is done (a test, never a
  // wait): how the host learns that one item's queued work is done while later ones run.
  virtual int64_t n_steps() const = 0;
  virtual bool step_done(int64_t k) = 0;
};

}  // namespace lfm2
