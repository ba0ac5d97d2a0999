// A stage's program for one item, by the stage's place and the item's plan, and the chart of a
// schedule drawn from its plans alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rank/engine/schedule_chart.h"
#include "rank/engine/stage_program.h"

namespace lfm2 {
namespace {

StepPlan plan(StepPlan::Kind kind, int64_t item, int64_t micro, int64_t feedback_from, int feeds_slot,
              int32_t gen_step = -1) {
  StepPlan p;
  p.item = item;
  p.kind = kind;
  p.micro = micro;
  p.seqs = {{micro, int32_t(micro), 0, 1, 1, gen_step, kind == StepPlan::Kind::kDecode}};
  p.feedback_from = feedback_from;
  p.feedback_slot = feedback_from >= 0 ? int32_t(micro) : -1;
  p.feeds_slot = feeds_slot;
  return p;
}

std::string program(const StepPlan& p, bool first, bool last) { return program_text(item_program(p, first, last)); }

TEST(StageProgram, ScoringOnEachPlace) {
  const StepPlan s = plan(StepPlan::Kind::kScore, 0, 0, -1, -1);
  EXPECT_EQ(program(s, true, true), "input, layers, output, release");
  EXPECT_EQ(program(s, true, false), "free buffer, input, layers, send, release");
  EXPECT_EQ(program(s, false, false), "recv, post ahead, layers, send, release");
  EXPECT_EQ(program(s, false, true), "recv, post ahead, layers, output, release");
}

TEST(StageProgram, GenerationFeedsBackFromTheLastStageToTheFirst) {
  const StepPlan d = plan(StepPlan::Kind::kDecode, 5, 1, 3, 1, 1);
  EXPECT_EQ(program(d, true, false), "free buffer, recv feedback, input, layers, send, release");
  EXPECT_EQ(program(d, false, true),
            "recv, post ahead, layers, free feedback slot, output, send feedback, release");
  // One stage: the output's tokens are the next input's, in place; the last step feeds nobody.
  EXPECT_EQ(program(d, true, true), "input, layers, output, release");
  const StepPlan last = plan(StepPlan::Kind::kDecode, 9, 1, 7, -1, 2);
  EXPECT_EQ(program(last, false, true), "recv, post ahead, layers, output, release");
}

TEST(ScheduleChart, DrawsEachStagesItemsTickByTick) {
  std::vector<StepPlan> plans;
  for (int64_t g = 0; g < 2; ++g) plans.push_back(plan(StepPlan::Kind::kPrefill, g, g, -1, int(g), 0));
  for (int64_t g = 0; g < 2; ++g) plans.push_back(plan(StepPlan::Kind::kDecode, 2 + g, g, g, -1, 1));
  const ScheduleTimeline t = simulate_schedule(plans, 3);
  // Step 1 of microbatch 0 starts once the last stage has chosen its tokens (tick 2).
  const std::vector<std::string> want = {
      "stage 0 | p0   p1   .    d1.0 d1.1 .    .",
      "stage 1 | .    p0   p1   .    d1.0 d1.1 .",
      "stage 2 | .    .    p0   p1   .    d1.0 d1.1",
  };
  EXPECT_EQ(chart_lines(t, plans), want);
  EXPECT_EQ(t.n_ticks, 7);
  EXPECT_DOUBLE_EQ(t.bubble(), 1.0 - 12.0 / 21.0);
}

}  // namespace
}  // namespace lfm2
