// The pipeline engine of one stage: work items flow rank 0 -> 1 -> ... -> P-1.
//
// A job (PipelineJob) says what the items are and what each stage does with one: the first stage
// makes its input (embed), every stage runs its layers, the last stage takes its output (the head).
// Scoring has one item per microbatch (score_job.h); generation one per microbatch and step, and
// the last stage's output of an item (the chosen tokens) feeds back to the first stage's input of a
// later one (generate_job.h). Items run in order on every stage (GPipe fill and drain: with M items
// the bubble is (P-1)/(M+P-1)).
//
// Three hidden-state buffers per stage (P > 1) let a stage compute item i while it receives i+1 and
// sends i-1; buffer i % 3 is reused by i+3 once i has been sent. Sends and receives are separate
// operations of the transport (on a GPU, separate NCCL communicators and streams), so neither
// queues behind the other; the feedback link (last -> first) has its own too.
//
// Device executors (CUDA): the host only queues. For each item it posts the receive (ordered on
// the device after the compute that last read its buffer and the send out of it), orders the
// compute stream after it, queues the steps and the send, and goes on to the next item without
// waiting; completed transfers are released as the host passes by (a test, never a wait). It waits
// only at the end of the run, for every transfer in order (each against --timeout), and then for
// the compute stream. Busy time and spans come from a BusyTimer (CUDA events).
// Host executors (CPU): each step runs to completion on a worker thread while this thread keeps
// MPI progressing; a receive is waited for before its compute, a send before its buffer is reused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/stage_executor.h"
#include "rank/engine/busy_timer.h"
#include "rank/mpi/watchdog.h"
#include "rank/mpi/world.h"
#include "rank/transport/trace_span.h"
#include "rank/transport/transport.h"

namespace lfm2 {

class PipelineJob {
 public:
  virtual ~PipelineJob() = default;
  virtual int64_t n_items() const = 0;
  // Bytes of hidden states item i carries from stage to stage (at most the engine's buffer size).
  virtual size_t item_bytes(int64_t i) const = 0;

  // The steps of an item, each queued on the executor: the first stage's input into x, every
  // stage's layers on x, the last stage's output from x. Their names label busy spans and traces.
  virtual void input(int64_t i, void* x) = 0;
  virtual void layers(int64_t i, void* x) = 0;
  virtual void output(int64_t i, void* x) = 0;
  // "microbatch 3": how errors and timeouts name an item.
  virtual std::string item_name(int64_t i) const = 0;
  virtual const char* input_name() const { return "embed"; }
  virtual const char* layers_name() const { return "forward"; }
  virtual const char* output_name() const { return "head"; }

  // Feedback (last stage -> first stage): item i's input needs what the output of item
  // feedback_source(i) (< i) left in feedback slot feedback_slot(that item); -1: none. A slot's
  // buffer is job-owned memory on each of the two stages (the executor's: device memory on a GPU),
  // feedback_bytes(item) of it used by that item; the engine sends it from the last stage to the
  // first, or, with one stage, the input reads what the output wrote.
  virtual int64_t feedback_source(int64_t i) const {
    (void)i;
    return -1;
  }
  virtual bool feeds_back(int64_t item) const {  // some later item's feedback_source
    (void)item;
    return false;
  }
  virtual int feedback_slot(int64_t item) const {
    (void)item;
    return 0;
  }
  virtual void* feedback_buffer(int slot) {
    (void)slot;
    return nullptr;
  }
  virtual size_t feedback_bytes(int64_t item) const {
    (void)item;
    return 0;
  }
};

struct StageTiming {
  double wall_s = 0;  // first compute to last send done
  double busy_s = 0;  // inside the steps
};

class Pipeline {
 public:
  // Allocates this stage's hidden-state buffers of max_item_tokens tokens each through the executor
  // (before the ready agreement).
  Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, int64_t hidden,
           int64_t max_item_tokens);

  // Runs every item of `job` once on this stage. Transport errors and timeouts throw.
  StageTiming run(PipelineJob& job);

  // Test hook: this rank raises `signal` (SIGKILL: dies; SIGSTOP: stalls) after finishing item `i`
  // (-1: never).
  void set_kill_after(int64_t i, int signal) {
    kill_after_ = i;
    kill_signal_ = signal;
  }

  // Device executors: measure busy time with `timer` (not owned) instead of a synchronisation per step.
  void set_busy_timer(BusyTimer* timer) { timer_ = timer; }
  // Record the spans of every run (compute, transfers, host waits); trace() returns the last run's.
  void set_tracing(bool on);
  const std::vector<TraceSpan>& trace() const { return trace_; }

  int n_buffers() const { return n_buf_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  StageExecutor& executor() { return exec_; }
  const WorldConfig& world() const { return world_; }

 private:
  class Run;

  WorldConfig world_;
  StageExecutor& exec_;
  Transport& transport_;
  int n_buf_ = 1;
  size_t buffer_bytes_ = 0;
  std::vector<void*> buf_;  // hidden states of max_item_tokens tokens each
  BusyTimer* timer_ = nullptr;
  // Device executors: queueing an item is microseconds of host work, but a CUDA call inside it may
  // synchronise the device; this bounds it by --timeout.
  std::unique_ptr<Watchdog> queue_guard_;
  bool tracing_ = false;
  std::vector<TraceSpan> trace_;
  int64_t kill_after_ = -1;
  int kill_signal_ = 0;
};

// The GPipe bubble fraction (P-1)/(M+P-1).
double gpipe_bubble(int n_stages, int64_t n_micro);

}  // namespace lfm2
