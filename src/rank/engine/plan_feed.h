// Where a stage's run takes its items' plans from (interpreter.h), item after item.
//
// A static schedule is replayed on every rank (StaticFeed: every plan known before the run). With
// continuous batching the first stage's scheduler decides each item as the tokens of earlier items
// come back, and every other stage learns each plan from the stage before it (the plans travel on
// the host, plan_link.h, sent as each item is queued, ahead of its hidden states): a feed may then
// have to wait for the next plan, and knows the ones after it only once they arrived.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rank/engine/step_plan.h"

namespace lfm2 {

class PlanFeed {
 public:
  virtual ~PlanFeed() = default;
  // The plan of item i, the run's next (items come in order from 0), waiting for it where it must;
  // null when the run ended before item i. Valid until release_before() passes it.
  virtual const StepPlan* next(int64_t i) = 0;
  // Item j's plan (j > the last next()) if this stage has it already, never waiting; else null.
  virtual const StepPlan* ahead(int64_t j) = 0;
  // Item i's plan if it is still held (i <= the last next(), not released), else null.
  virtual const StepPlan* held(int64_t i) const = 0;
  // The stage will not ask again for items before i.
  virtual void release_before(int64_t i) { (void)i; }
  // Whether the plans travel: stages other than the last forward each plan to the next stage.
  virtual bool travels() const { return false; }
  // Forwards plan i to the next stage (travels()); at the end of the run, the end.
  virtual void forward(int64_t i) { (void)i; }
  // Last stage: item i's chosen tokens (its emitting entries', in entry order) are on this host.
  virtual void chosen(int64_t i, const int32_t* tokens, int64_t n) { (void)i, (void)tokens, (void)n; }
  // Last stage, a reporting item queued: its chosen tokens will be at `tokens` (host memory) once its
  // work is done: done(false) tests it, done(true) waits for it (against --timeout). By default the
  // feed waits at once and hands them to chosen(); a feed that plans ahead (the first stage's
  // scheduler, one stage) takes them when it needs them, while the next item runs.
  using Done = std::function<bool(bool wait)>;
  virtual void reported(int64_t i, const int32_t* tokens, int64_t n, const Done& done) {
    done(true);
    chosen(i, tokens, n);
  }
  // The run is over on this stage (every item queued): transfers of its own to finish.
  virtual void finish() {}
};

// Every plan known before the run, on every rank.
class StaticFeed final : public PlanFeed {
 public:
  explicit StaticFeed(const std::vector<StepPlan>& plans);
  const StepPlan* next(int64_t i) override { return held(i); }
  const StepPlan* ahead(int64_t j) override { return held(j); }
  const StepPlan* held(int64_t i) const override {
    return i >= 0 && i < int64_t(plans_.size()) ? &plans_[size_t(i)] : nullptr;
  }

 private:
  const std::vector<StepPlan>& plans_;
};

}  // namespace lfm2
