// The GPipe schedule of one stage: microbatches flow rank 0 -> 1 -> ... -> P-1.
//
// N sequences of S tokens are cut into M microbatches of `microbatch` sequences (the last may be
// smaller). Rank 0 embeds microbatch m and sends it on as soon as its layers are done; every other
// rank receives m, runs its layers and sends m on, with the receive of m+1 already posted into the
// second of two hidden-state buffers, so transfers overlap compute (fill and drain; the bubble is
// (P-1)/(M+P-1)). The last rank applies the final norm and the LM head and takes the top-1 token.
// Each microbatch's rows are computed independently of how the batch was cut, so the results are
// bit-identical for any P and microbatch size.
//
// On the CPU each step runs to completion (on a worker thread while this thread keeps MPI moving).
// With a device executor (CUDA) the steps only queue work on the executor's compute stream and the
// transport orders its transfers against it with events: no host synchronisation per step or layer.
// The host waits only where a deadline must be enforced: for each received microbatch (the
// transport's wait polls the receive's event against --timeout), on the first stage for the send
// out of a buffer before embedding into it again, and on the last stage inside head() (its logits
// come to the host). A buffer that receives again follows the send out of it on the transport's
// stream, so those sends are only checked (test) as the run goes and waited for at its end. Busy
// time then comes from a BusyTimer on the compute stream (CUDA events); without one each step is
// synchronised and timed on the host, as on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/stage_executor.h"
#include "rank/stage_plan.h"
#include "rank/transport.h"
#include "rank/world.h"

namespace lfm2 {

struct PipelineShape {
  int64_t n_seq = 0, seq_len = 0;  // the whole batch (N, S)
  int64_t microbatch = 1;          // sequences per microbatch
  int64_t hidden = 0, vocab = 0;
  bool all_logits = false;  // head on every position, not only the last

  int64_t n_micro() const { return (n_seq + microbatch - 1) / microbatch; }
  int64_t micro_begin(int64_t m) const { return m * microbatch; }
  int64_t micro_size(int64_t m) const;
};

// Results, filled on the last rank only.
struct PipelineResult {
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> logits;        // (N, V) last position
  std::vector<float> all_logits;    // (N, S, V) with all_logits
};

// Timing of one run on this rank.
// Busy time of an executor whose work is asynchronous: begin()/end() bracket one step's queued work;
// busy_s() (after the run) waits for it and returns the sum since reset().
class BusyTimer {
 public:
  virtual ~BusyTimer() = default;
  virtual void reset() = 0;
  virtual void begin() = 0;
  virtual void end() = 0;
  virtual double busy_s() = 0;
};

struct StageTiming {
  double wall_s = 0;  // first compute to last send done
  double busy_s = 0;  // inside embed / forward / head
};

class Pipeline {
 public:
  // Allocates this stage's hidden-state buffers through the executor (before the ready agreement).
  Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, const PipelineShape& shape);

  // Runs the whole batch once. ids (N, S) is needed on the first rank only. Fills `result` on the
  // last rank. Transport errors and timeouts throw.
  StageTiming run(const int32_t* ids, PipelineResult* result);

  // Test hook: this rank raises `signal` (SIGKILL: dies; SIGSTOP: stalls) after finishing
  // microbatch `m` (-1: never).
  void set_kill_after(int64_t m, int signal) {
    kill_after_ = m;
    kill_signal_ = signal;
  }

  // Device executors: measure busy time with `timer` (not owned) instead of a synchronisation per step.
  void set_busy_timer(BusyTimer* timer) { timer_ = timer; }

  const PipelineShape& shape() const { return shape_; }

 private:
  size_t micro_bytes(int64_t m) const;

  WorldConfig world_;
  StageExecutor& exec_;
  Transport& transport_;
  PipelineShape shape_;
  void* buf_[2] = {nullptr, nullptr};  // double buffers of microbatch * seq_len tokens
  std::vector<float> head_out_;        // (microbatch, V) or (microbatch * S, V)
  BusyTimer* timer_ = nullptr;
  int64_t kill_after_ = -1;
  int kill_signal_ = 0;
};

// The GPipe bubble fraction (P-1)/(M+P-1).
double gpipe_bubble(int n_stages, int64_t n_micro);

}  // namespace lfm2
