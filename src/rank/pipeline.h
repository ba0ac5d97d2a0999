// The GPipe schedule of one stage: microbatches flow rank 0 -> 1 -> ... -> P-1.
//
// N sequences of S tokens are cut into M microbatches of `microbatch` sequences (the last may be
// smaller). Rank 0 embeds microbatch m and sends it on as soon as its layers are done; every other
// rank receives m, runs its layers and sends m on; the last rank applies the final norm and the LM
// head and takes the top-1 token (fill and drain: the bubble is (P-1)/(M+P-1)). Each microbatch's
// rows are computed independently of how the batch was cut, so the results are bit-identical for
// any P and microbatch size.
//
// Three hidden-state buffers per stage (P > 1) let a stage compute m while it receives m+1 and
// sends m-1; buffer m % 3 is reused by m+3 once m has been sent. Sends and receives are separate
// operations of the transport (on a GPU, separate NCCL communicators and streams), so neither
// queues behind the other.
//
// Device executors (CUDA): the host only queues. For each microbatch it posts the receive (ordered
// on the device after the compute that last read its buffer and the send out of it), orders the
// compute stream after it, queues the step and the send, and goes on to the next microbatch
// without waiting; completed transfers are released as the host passes by (a test, never a wait).
// It waits only at the end of the run, for every transfer in order (each against --timeout), and
// then for the compute stream. Busy time and spans come from a BusyTimer (CUDA events).
// Host executors (CPU): each step runs to completion on a worker thread while this thread keeps
// MPI progressing; a receive is waited for before its compute, a send before its buffer is reused.
#pragma once

#include <cstdint>
#include <vector>

#include "model/stage_executor.h"
#include "rank/stage_plan.h"
#include "rank/trace.h"
#include "rank/transport.h"
#include "rank/world.h"

namespace lfm2 {

struct PipelineShape {
  int64_t n_seq = 0, seq_len = 0;  // the whole batch (N, S)
  int64_t microbatch = 1;          // sequences per microbatch
  int64_t hidden = 0, vocab = 0;
  bool logits = true;       // bring the last position's logits to the host (else next token and margin only)
  bool all_logits = false;  // also the logits of every position
  std::vector<int32_t> lengths;  // (N) prompt lengths: the head reads position lengths[i] - 1; empty: S

  int64_t n_micro() const { return (n_seq + microbatch - 1) / microbatch; }
  int64_t micro_begin(int64_t m) const { return m * microbatch; }
  int64_t micro_size(int64_t m) const;
};

// Results, filled on the last rank only.
struct PipelineResult {
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> margin;        // (N) top-1 logit minus the runner-up's
  std::vector<float> logits;        // (N, V) last position, when shape.logits
  std::vector<float> all_logits;    // (N, S, V) with all_logits
};

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
};

struct StageTiming {
  double wall_s = 0;  // first compute to last send done
  double busy_s = 0;  // inside embed / forward / head
};

class Pipeline {
 public:
  // Allocates this stage's hidden-state and result buffers through the executor (before the ready
  // agreement).
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
  // Record the spans of every run (compute, transfers, host waits); trace() returns the last run's.
  void set_tracing(bool on);
  const std::vector<TraceSpan>& trace() const { return trace_; }

  const PipelineShape& shape() const { return shape_; }
  int n_buffers() const { return n_buf_; }

 private:
  class Run;
  size_t micro_bytes(int64_t m) const;

  WorldConfig world_;
  StageExecutor& exec_;
  Transport& transport_;
  PipelineShape shape_;
  int n_buf_ = 1;
  std::vector<void*> buf_;        // hidden states of microbatch * seq_len tokens each
  int32_t* ids_ = nullptr;        // (N, S) first stage: the run's ids, in alloc_host memory
  int32_t* next_token_ = nullptr;  // (N) last stage, alloc_host memory
  float* margin_ = nullptr;       // (N)
  float* logits_ = nullptr;       // (N, V) with shape.logits
  float* all_logits_ = nullptr;   // (N, S, V) with shape.all_logits
  int32_t* lengths_ = nullptr;    // (N) last stage with shape.lengths, alloc_host memory
  BusyTimer* timer_ = nullptr;
  bool tracing_ = false;
  std::vector<TraceSpan> trace_;
  int64_t kill_after_ = -1;
  int kill_signal_ = 0;
};

// The GPipe bubble fraction (P-1)/(M+P-1).
double gpipe_bubble(int n_stages, int64_t n_micro);

}  // namespace lfm2
