// Generation with continuous batching (issue 20) on one stage: the memory of the job here and where
// its plans come from. Every stage holds the same pool of KV pages and slots (the executor's batch
// state, sized at start-up and agreed by every stage). The first stage runs the scheduler
// (batch_scheduler.h) behind a plan feed (SchedulerFeed): it takes prompts from a PromptSource as
// room frees up, plans each item once fewer than P are in flight, stages the item's prompt ids and
// fed tokens in pinned host memory, sends each plan on the host link to the next stage, and takes
// the tokens each item chose (on the link from the last stage; with one stage, from itself),
// handing finished sequences to a sink. Other stages replay the plans as they arrive (LinkFeed);
// the last stage reports each item's tokens back. With one stage the scheduler plans one item
// ahead (batch_scheduler.h's look-ahead): it queues item i + 1 before it reads item i's tokens, so
// the device never waits for the host between items.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "model/stage_executor.h"
#include "rank/engine/link_feed.h"
#include "rank/engine/plan_feed.h"
#include "rank/engine/plan_link.h"
#include "rank/engine/stage_steps.h"
#include "rank/batching/batch_scheduler.h"
#include "rank/mpi/world.h"

namespace lfm2 {

struct ContinuousShape {
  StateShape state;                // slots (--max-seqs), pages, page size, pages a sequence may hold
  int64_t max_batched_tokens = 1;  // rows per item
  int64_t admit_wave = 0;          // the scheduler's (0: its default)
  bool prefill_first = false;      // the scheduler's
  int64_t hidden = 0;
  bool per_sequence_sampling = false;
  bool look_ahead = true;  // one stage: plan one item ahead (off: each item planned once the one
                           // before is done, as with P stages)

  // Tokens of hidden-state buffer an item may need (its rows and its decode entries' flags).
  int64_t max_item_tokens() const;
};

// The prompts in the order they are to run, handed out one at a time.
class PromptSource {
 public:
  enum class Next { kGot, kLater, kEnd };
  virtual ~PromptSource() = default;
  // The next prompt and its ids (prompt_len of them) (kGot); kLater when more may come but none is
  // here yet (asked for), kEnd when there are no more.
  virtual Next next(SeqRequest* request, std::vector<int32_t>* ids) = 0;
};

// The first stage's plans: the scheduler's decisions (plan_feed.h), and the staging of each item's
// host inputs (stage_steps.h).
class SchedulerFeed final : public PlanFeed, public InputStaging {
 public:
  using Sink = std::function<void(FinishedSeq&&)>;
  using Idle = std::function<void()>;
  // Pinned host memory for the staging ring: one buffer more than the items that may be in flight
  // (max_in_flight, + 1 with look-ahead), of max_batched_tokens ids, and as many of max_seqs tokens.
  struct Staging {
    std::vector<int32_t*> ids, fed;
  };
  // link: null with one stage.
  // idle: called while the feed waits (for tokens, for prompts), and at every item.
  SchedulerFeed(const SchedulerConfig& config, PlanLink* link, const Staging& staging, PromptSource& source,
                Sink sink, Idle idle, double timeout_s);

  const StepPlan* next(int64_t i) override;
  const StepPlan* ahead(int64_t j) override { return held(j); }
  void reported(int64_t i, const int32_t* tokens, int64_t n, const Done& done) override;
  const StepPlan* held(int64_t i) const override;
  void release_before(int64_t i) override;
  bool travels() const override { return link_ != nullptr; }
  void forward(int64_t i) override;
  void chosen(int64_t i, const int32_t* tokens, int64_t n) override;
  void finish() override;
  StagedInput stage(const StepPlan& plan) override;

  const BatchScheduler& scheduler() const { return sched_; }
  int64_t added() const { return added_; }

 private:
  void top_up();
  void take_reports(bool wait);
  bool take_local();
  void complete(int64_t item, const int32_t* tokens, int64_t n);

  BatchScheduler sched_;
  PlanLink* link_;
  PromptSource& source_;
  Sink sink_;
  Idle idle_;
  double timeout_s_;
  bool source_done_ = false;
  int64_t added_ = 0;
  std::map<int64_t, std::vector<int32_t>> prompts_;  // the ids of every queued or running sequence
  std::deque<StepPlan> window_;                      // items base_, base_ + 1, ...
  struct Local {  // one stage: an item queued, its tokens read when the scheduler needs them
    int64_t item;
    const int32_t* tokens;
    int64_t n;
    Done done;
  };
  std::deque<Local> local_;
  int64_t base_ = 0;
  bool end_sent_ = false;
  // Staging ring (pinned): an item's ids stay put until it is done; item j is planned only once
  // item j - F is done (F items in flight at most), so F + 1 buffers suffice.
  Staging staging_;
};

// The job on one stage: the batch state, this stage's memory for the steps, and its plan feed.
class ContinuousJob {
 public:
  // Allocates the state and buffers through the executor (before the ready agreement).
  ContinuousJob(const WorldConfig& pipe, StageExecutor& exec, const ContinuousShape& shape,
                const SamplingParams& sampling, double timeout_s);

  // Before each run, on every stage: a fresh feed; the first stage's takes its prompts from
  // `source` and hands finished sequences to `sink` (other stages: null, empty).
  void prepare(PromptSource* source, SchedulerFeed::Sink sink, SchedulerFeed::Idle idle = {});
  // --stream, on the first stage: every token a JSON event line on stdout as the scheduler gets it.
  void set_stream(bool on) { stream_ = on; }

  PlanFeed& feed() { return *feed_; }
  const StepMemory& memory() const { return memory_; }
  const ContinuousShape& shape() const { return shape_; }
  // First stage, after a run: the scheduler's counters.
  const SchedulerFeed* scheduler_feed() const { return sched_feed_; }
  double timeout_s() const { return timeout_s_; }
  // One stage plans one item ahead (batch_scheduler.h), unless ContinuousShape::look_ahead is off.
  bool look_ahead() const { return pipe_.size == 1 && shape_.look_ahead; }

 private:
  WorldConfig pipe_;
  StageExecutor& exec_;
  ContinuousShape shape_;
  SamplingParams sampling_;
  double timeout_s_;
  std::unique_ptr<PlanLink> link_;
  std::unique_ptr<PlanFeed> feed_;
  SchedulerFeed* sched_feed_ = nullptr;
  SchedulerFeed::Staging staging_;
  StepMemory memory_;
  bool stream_ = false;
};

}  // namespace lfm2
