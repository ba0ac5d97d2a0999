#include "rank/engine/link_feed.h"

#include "common/error.h"

namespace lfm2 {

bool LinkFeed::pull(bool wait) {
  if (ended_) return false;
  StepPlan p;
  switch (link_.recv_plan(&p, wait)) {
    case PlanLink::Got::kNone: return false;
    case PlanLink::Got::kEnd: ended_ = true; return false;
    case PlanLink::Got::kPlan: break;
  }
  const int64_t want = base_ + int64_t(window_.size());
  LFM2_CHECK(p.item == want, "plan link: item ", p.item, " arrived, expected item ", want);
  window_.push_back(std::move(p));
  return true;
}

const StepPlan* LinkFeed::next(int64_t i) {
  while (i >= base_ + int64_t(window_.size()) && pull(true)) {
  }
  const StepPlan* p = held(i);
  if (!p && !last_ && !end_sent_) {
    link_.send_end();
    end_sent_ = true;
  }
  return p;
}

const StepPlan* LinkFeed::ahead(int64_t j) {
  while (j >= base_ + int64_t(window_.size()) && pull(false)) {
  }
  return held(j);
}

const StepPlan* LinkFeed::held(int64_t i) const {
  return i >= base_ && i < base_ + int64_t(window_.size()) ? &window_[size_t(i - base_)] : nullptr;
}

void LinkFeed::release_before(int64_t i) {
  while (base_ < i && !window_.empty()) {
    window_.pop_front();
    ++base_;
  }
}

void LinkFeed::forward(int64_t i) {
  if (last_) return;
  const StepPlan* p = held(i);
  LFM2_CHECK(p, "plan link: no plan of item ", i, " to forward");
  link_.send_plan(*p);
}

}  // namespace lfm2
