#include "rank/engine/plan_feed.h"

namespace lfm2 {

StaticFeed::StaticFeed(const std::vector<StepPlan>& plans) : plans_(plans) {}

}  // namespace lfm2
