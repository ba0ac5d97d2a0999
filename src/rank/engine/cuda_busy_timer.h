// The busy timer of a CUDA stage (engine/busy_timer.h) on CUDA events. Declared without CUDA
// headers; defined in cuda_busy_timer.cpp, built only with the CUDA backend.
#pragma once

#include <memory>

#include "model/cuda_stage.h"
#include "rank/engine/busy_timer.h"

namespace lfm2 {

// Busy time of a CUDA stage: begin()/end() record events on the executor's compute stream around
// each step; busy_s() waits for the last one and sums the elapsed times. origin() is the event
// recorded at reset(), the zero of the run's GPU timeline.
class CudaBusyTimer : public BusyTimer {
 public:
  virtual CUevent_st* origin() const = 0;
};

std::unique_ptr<CudaBusyTimer> make_cuda_busy_timer(CudaStageExecutor& exec);

}  // namespace lfm2
