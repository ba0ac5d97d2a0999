// Busy time of a CUDA stage from pairs of CUDA events on its compute stream (see cuda_rank.h).
//
// The pipeline queues GPU work without waiting for it, so host clocks around a call measure the
// launch, not the work. An event pair per step measures the work itself: the start event completes
// when the stream reaches it (after earlier work and any event the stream waits for), the stop event
// when the step's kernels are done.
#include <vector>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "rank/cuda_rank.h"

namespace lfm2 {
namespace {

class CudaBusyTimer final : public BusyTimer {
 public:
  explicit CudaBusyTimer(CudaStageExecutor& exec) : exec_(exec) {}

  ~CudaBusyTimer() override {
    cudaSetDevice(exec_.device());
    for (auto& p : pairs_) {
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
  }

  void reset() override { used_ = 0; }

  void begin() override {
    if (used_ == pairs_.size()) {
      CUDA_CHECK(cudaSetDevice(exec_.device()));
      Pair p;
      CUDA_CHECK(cudaEventCreate(&p.start));
      CUDA_CHECK(cudaEventCreate(&p.stop));
      pairs_.push_back(p);
    }
    exec_.record_event(pairs_[used_].start);
  }

  void end() override { exec_.record_event(pairs_[used_++].stop); }

  double busy_s() override {
    double total_ms = 0;
    for (size_t i = 0; i < used_; ++i) {
      CUDA_CHECK(cudaEventSynchronize(pairs_[i].stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, pairs_[i].start, pairs_[i].stop));
      total_ms += double(ms);
    }
    return total_ms / 1000.0;
  }

 private:
  struct Pair {
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  CudaStageExecutor& exec_;
  std::vector<Pair> pairs_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<BusyTimer> make_cuda_busy_timer(CudaStageExecutor& exec) {
  return std::make_unique<CudaBusyTimer>(exec);
}

}  // namespace lfm2
