// Busy time and compute spans of a CUDA stage from CUDA events on its compute stream (cuda_busy_timer.h).
//
// The pipeline queues GPU work without waiting for it, so host clocks around a call measure the
// launch, not the work. An event pair per step measures the work itself: the start event completes
// when the stream reaches it (after earlier work and any event the stream waits for), the stop event
// when the step's kernels are done. The origin event, recorded at reset(), is the zero of every span
// (the NCCL transport times its transfers against it too).
#include <vector>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "rank/engine/cuda_busy_timer.h"

namespace lfm2 {
namespace {

class CudaBusyTimerImpl final : public CudaBusyTimer {
 public:
  explicit CudaBusyTimerImpl(CudaStageExecutor& exec) : exec_(exec) {
    CUDA_CHECK(cudaSetDevice(exec_.device()));
    CUDA_CHECK(cudaEventCreate(&origin_));
  }

  ~CudaBusyTimerImpl() override {
    cudaSetDevice(exec_.device());
    for (auto& s : steps_) {
      cudaEventDestroy(s.start);
      cudaEventDestroy(s.stop);
    }
    cudaEventDestroy(origin_);
  }

  void reset() override {
    used_ = 0;
    exec_.record_event(origin_);
  }

  void begin(const char* what, int64_t micro) override {
    if (used_ == steps_.size()) {
      CUDA_CHECK(cudaSetDevice(exec_.device()));
      Step s;
      CUDA_CHECK(cudaEventCreate(&s.start));
      CUDA_CHECK(cudaEventCreate(&s.stop));
      steps_.push_back(s);
    }
    steps_[used_].what = what;
    steps_[used_].micro = micro;
    exec_.record_event(steps_[used_].start);
  }

  void end() override { exec_.record_event(steps_[used_++].stop); }

  double busy_s() override {
    double total = 0;
    for (size_t i = 0; i < used_; ++i) total += seconds(steps_[i].start, steps_[i].stop);
    return total;
  }

  std::vector<TraceSpan> spans() override {
    std::vector<TraceSpan> out;
    for (size_t i = 0; i < used_; ++i)
      out.push_back({Track::kCompute, steps_[i].what, steps_[i].micro, seconds(origin_, steps_[i].start),
                     seconds(origin_, steps_[i].stop)});
    return out;
  }

  int64_t n_steps() const override { return int64_t(used_); }

  bool step_done(int64_t k) override {
    LFM2_CHECK(k >= 0 && size_t(k) < used_, "busy timer: step ", k, " of ", used_);
    const cudaError_t e = cudaEventQuery(steps_[size_t(k)].stop);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
  }

  CUevent_st* origin() const override { return origin_; }

 private:
  struct Step {
    cudaEvent_t start = nullptr, stop = nullptr;
    const char* what = "";
    int64_t micro = -1;
  };

  static double seconds(cudaEvent_t a, cudaEvent_t b) {
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return double(ms) / 1000.0;
  }

  CudaStageExecutor& exec_;
  cudaEvent_t origin_ = nullptr;
  std::vector<Step> steps_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<CudaBusyTimer> make_cuda_busy_timer(CudaStageExecutor& exec) {
  return std::make_unique<CudaBusyTimerImpl>(exec);
}

}  // namespace lfm2
