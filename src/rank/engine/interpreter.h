// The interpreters of a stage's program (stage_program.h): one run of a schedule on this stage.
//
// StageInterpreter holds what both paths share: the items in order, as its plan feed gives them
// (plan_feed.h: a static schedule, or plans decided item by item on the first stage), each
// instruction's transport calls, and the transfers in flight (per buffer its receive and the last send out of it, per
// feedback slot its last send, every pending one in the order posted). What differs is in the two
// interpreters:
//
// HostInterpreter (CPU executors): each compute step runs to completion on a worker thread while
// this thread keeps MPI progressing; a receive is waited for before its compute, a send before its
// buffer is reused; receives ahead are posted only into buffers whose last send has completed.
//
// DeviceInterpreter (CUDA): the host only queues. A receive is ordered on the device after the
// compute that last read its buffer and the send out of it, the compute stream after the receive;
// steps are queued between the busy timer's events, and the host goes on to the next item without
// waiting; completed transfers are released as it passes by. It waits only at the end of the run,
// for every transfer in order (each against --timeout), and then for the compute stream.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "model/stage_executor.h"
#include "rank/engine/busy_timer.h"
#include "rank/engine/plan_feed.h"
#include "rank/engine/stage_program.h"
#include "rank/engine/stage_steps.h"
#include "rank/engine/step_plan.h"
#include "rank/mpi/watchdog.h"
#include "rank/mpi/world.h"
#include "rank/transport/trace_span.h"
#include "rank/transport/transport.h"

namespace lfm2 {

struct StageTiming {
  double wall_s = 0;  // first compute to last send done
  double busy_s = 0;  // inside the steps
};

// What a stage runs with (the pipeline's, pipeline.h): its place, its executor and transport, its
// hidden-state buffers, and how a run is watched and traced.
struct StageParts {
  WorldConfig world;
  StageExecutor* exec = nullptr;
  Transport* transport = nullptr;
  int64_t hidden = 0;
  size_t buffer_bytes = 0;
  std::vector<void*> buffers;  // hidden states, buffer_bytes each
  BusyTimer* timer = nullptr;  // device executors: busy time from the device's clock
  // Device executors: queueing an item is microseconds of host work, but a CUDA call inside it may
  // synchronise the device; this bounds it by --timeout.
  std::unique_ptr<Watchdog> queue_guard;
  bool tracing = false;
  int64_t kill_after = -1;  // test hook: raise kill_signal after this item
  int kill_signal = 0;
};

class StageInterpreter {
 public:
  StageInterpreter(StageParts& parts, PlanFeed& feed, const StepMemory& memory);
  virtual ~StageInterpreter() = default;

  // Runs every item of the schedule on this stage. Transport errors and timeouts throw. With
  // tracing, `trace` receives the run's spans.
  StageTiming run(std::vector<TraceSpan>* trace);

 protected:
  using Handle = Transport::Handle;
  enum class Kind { kRecv, kSend, kFeedbackRecv, kFeedbackSend };
  struct Pending {
    Handle h;
    int64_t item;
    Kind kind;
    bool ordered;  // device receive: the compute stream already waits for it
    double posted_s;
    bool is_send() const { return kind == Kind::kSend || kind == Kind::kFeedbackSend; }
  };

  // ---- what the two paths do differently
  virtual void start() {}
  // The compute queued next follows operation h (what names it in a wait, and the item).
  virtual void after(Handle h, const char* what, int64_t item) = 0;
  // A receive into a buffer whose last send is `send` (of item send_item; kNone: none): the handle
  // the transport orders the receive after (the host waits for the send here instead: kNone).
  virtual Handle receive_after(Handle send, int64_t send_item) = 0;
  // Whether a receive may be posted ahead into a buffer whose last send is `send`.
  virtual bool may_post_ahead(Handle send) = 0;
  // Runs (host) or queues (device) one compute step.
  virtual void compute(const char* name, int64_t item, const std::function<void()>& step) = 0;
  virtual void queued(int64_t item, double t0) { (void)item, (void)t0; }
  virtual void released(const Pending& q) { (void)q; }
  virtual void finished() {}
  virtual double busy_s() const = 0;
  virtual void add_spans() {}
  // Whether item i's work, queued up to now, is done (plan_feed.h's Done).
  virtual PlanFeed::Done item_done(int64_t i) = 0;

  // ---- shared by both paths
  void wait_pending(Handle h, const char* name, int64_t item);
  bool test_pending(Handle h);
  void mark_ordered(Handle h);
  void span(Track track, const char* name, int64_t item, double t0, double t1);
  void host_span(const char* name, int64_t item, double t0);
  void first_work();

  StageParts& p_;
  Transport& transport_;
  StageExecutor& exec_;
  const bool single_stage_;  // first and last: nothing moves between stages
  std::vector<TraceSpan> trace_;

 private:
  void execute(StageOp op, int64_t i);
  void free_buffer(int64_t i);
  void recv(int64_t i);
  void recv_feedback(int64_t i);
  void post_ahead(int64_t i);
  void post_recv(int64_t j);
  void free_feedback_slot(int64_t i);
  void send_feedback(int64_t i);
  void send(int64_t i);
  void report(int64_t i);
  void release_done();
  void finish();
  void forget(const Pending& q);
  std::vector<Pending>::iterator find(Handle h);
  int buffer_of(int64_t i) const { return int(i % B_); }
  size_t bytes_of(const StepPlan& plan, int64_t i) const;
  const StepPlan& plan_of(int64_t i) const;  // a plan the feed still holds
  std::string name_of(int64_t i) const;      // how waits name item i

  PlanFeed& feed_;
  const StepMemory& memory_;
  const int B_;
  const bool first_, last_;
  std::vector<Handle> recv_h_, send_h_;  // per buffer: its pending receive / the last send out of it
  std::map<int, Handle> fb_send_h_;      // per feedback slot: the last send out of it (last stage)
  std::vector<Pending> pending_;         // transfers not yet released, in the order posted
  int64_t next_recv_ = 0;                // the next item to post a receive for
  double origin_ = 0, t_first_ = -1;
};

class HostInterpreter final : public StageInterpreter {
 public:
  using StageInterpreter::StageInterpreter;

 private:
  void after(Handle h, const char* what, int64_t item) override;
  Handle receive_after(Handle send, int64_t send_item) override;
  bool may_post_ahead(Handle send) override;
  void compute(const char* name, int64_t item, const std::function<void()>& step) override;
  void released(const Pending& q) override;
  double busy_s() const override { return busy_s_; }
  PlanFeed::Done item_done(int64_t i) override;

  double busy_s_ = 0;
};

class DeviceInterpreter final : public StageInterpreter {
 public:
  DeviceInterpreter(StageParts& parts, PlanFeed& feed, const StepMemory& memory)
      : StageInterpreter(parts, feed, memory), timer_(*parts.timer) {}

 private:
  void start() override { timer_.reset(); }
  void after(Handle h, const char* what, int64_t item) override;
  Handle receive_after(Handle send, int64_t send_item) override;
  bool may_post_ahead(Handle send) override;
  void compute(const char* name, int64_t item, const std::function<void()>& step) override;
  void queued(int64_t item, double t0) override { host_span("queue", item, t0); }
  void finished() override;
  double busy_s() const override { return timer_.busy_s(); }
  void add_spans() override;
  PlanFeed::Done item_done(int64_t i) override;

  BusyTimer& timer_;
};

}  // namespace lfm2
