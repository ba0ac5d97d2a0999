// The pipeline engine of one stage: the items of a schedule flow rank 0 -> 1 -> ... -> P-1.
//
// A schedule is a list of step plans (step_plan.h), one per item, made by a job's scheduler
// (jobs/schedulers.h): scoring has one item per microbatch; generation one per microbatch and
// step, and the last stage's chosen tokens of an item feed back to the first stage's input of a
// later one. Items run in order on every stage (GPipe fill and drain: with M items the bubble is
// (P-1)/(M+P-1)). Each stage turns an item's plan into its instructions (stage_program.h) and one
// of two interpreters runs them (interpreter.h): the host path for CPU executors, the device path,
// which only queues, for CUDA ones (those with a busy timer); their compute is the executor's
// (stage_steps.h).
//
// Three hidden-state buffers per stage (P > 1) let a stage compute item i while it receives i+1 and
// sends i-1; buffer i % 3 is reused by i+3 once i has been sent. Sends and receives are separate
// operations of the transport (on a GPU, separate NCCL communicators and streams), so neither
// queues behind the other; the feedback link (last -> first) has its own too.
#pragma once

#include <cstdint>
#include <vector>

#include "model/stage_executor.h"
#include "rank/engine/busy_timer.h"
#include "rank/engine/interpreter.h"
#include "rank/engine/plan_feed.h"
#include "rank/engine/stage_steps.h"
#include "rank/engine/step_plan.h"
#include "rank/mpi/world.h"
#include "rank/transport/trace_span.h"
#include "rank/transport/transport.h"

namespace lfm2 {

class Pipeline {
 public:
  // Allocates this stage's hidden-state buffers of max_item_tokens tokens each through the executor
  // (before the ready agreement).
  Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, int64_t hidden,
           int64_t max_item_tokens);

  // Runs every item of the schedule once on this stage, reading and writing the job's memory on
  // this stage. Every rank of the pipeline runs the same schedule. Transport errors and timeouts throw.
  StageTiming run(const std::vector<StepPlan>& schedule, const StepMemory& memory);
  // The same with plans from a feed (plan_feed.h): decided item by item, or travelling.
  StageTiming run(PlanFeed& feed, const StepMemory& memory);

  // Test hook: this rank raises `signal` (SIGKILL: dies; SIGSTOP: stalls) after finishing item `i`
  // (-1: never).
  void set_kill_after(int64_t i, int signal) {
    parts_.kill_after = i;
    parts_.kill_signal = signal;
  }

  // Device executors: measure busy time with `timer` (not owned) instead of a synchronisation per
  // step; with one, a device executor takes the device path.
  void set_busy_timer(BusyTimer* timer) { parts_.timer = timer; }
  // Record the spans of every run (compute, transfers, host waits); trace() returns the last run's.
  void set_tracing(bool on);
  const std::vector<TraceSpan>& trace() const { return trace_; }

  int n_buffers() const { return int(parts_.buffers.size()); }
  size_t buffer_bytes() const { return parts_.buffer_bytes; }
  StageExecutor& executor() { return *parts_.exec; }
  const WorldConfig& world() const { return parts_.world; }

 private:
  StageParts parts_;
  std::vector<TraceSpan> trace_;
};

}  // namespace lfm2
