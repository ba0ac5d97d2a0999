// The plans of a stage after the first with continuous batching (plan_feed.h): they arrive on the
// host link from the stage before (plan_link.h), each ahead of its hidden states; this stage
// forwards each to the next as it queues the item, and the last stage sends each reporting item's
// chosen tokens back to the first stage's scheduler. The end of the run arrives as a message of its
// own and is forwarded too.
#pragma once

#include <cstdint>
#include <deque>

#include "rank/engine/plan_feed.h"
#include "rank/engine/plan_link.h"

namespace lfm2 {

class LinkFeed final : public PlanFeed {
 public:
  LinkFeed(PlanLink& link, bool last_stage) : link_(link), last_(last_stage) {}

  const StepPlan* next(int64_t i) override;
  const StepPlan* ahead(int64_t j) override;
  const StepPlan* held(int64_t i) const override;
  void release_before(int64_t i) override;
  bool travels() const override { return true; }
  void forward(int64_t i) override;
  void chosen(int64_t i, const int32_t* tokens, int64_t n) override { link_.send_tokens(i, tokens, n); }
  void finish() override { link_.flush(); }

 private:
  bool pull(bool wait);  // one message into the window; false: none (or the end)

  PlanLink& link_;
  const bool last_;
  std::deque<StepPlan> window_;  // items base_, base_ + 1, ...
  int64_t base_ = 0;
  bool ended_ = false, end_sent_ = false;
};

}  // namespace lfm2
