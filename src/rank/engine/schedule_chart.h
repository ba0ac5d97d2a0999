// A schedule's timeline drawn from its plans alone: when each stage would run each item if every
// compute step took one tick and transfers took none. A stage runs its items in order; item i
// reaches stage r once stage r-1 has run it; an item that embeds fed-back tokens starts on the
// first stage once the last stage has chosen them. (The engine's three buffers per stage never
// hold an item back at equal ticks.) The chart is the GPipe picture of a run, its bubble the share
// of idle stage-ticks: for scoring it is GPipe's (P-1)/(M+P-1); generation with fewer microbatches
// than stages shows the stalls of the feedback.
//
//   stage 0 | p0   p1   .    d1.0 d1.1 .    .       generation of two microbatches, two tokens,
//   stage 1 | .    p0   p1   .    d1.0 d1.1 .       on three stages: p<g> the prefill of
//   stage 2 | .    .    p0   p1   .    d1.0 d1.1     microbatch g, d<t>.<g> its decode step t
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rank/engine/step_plan.h"

namespace lfm2 {

struct ScheduleTimeline {
  int n_stages = 1;
  int64_t n_ticks = 0;
  std::vector<std::vector<int64_t>> tick;  // [stage][item]: the tick at which the stage runs the item

  // Idle stage-ticks over all stage-ticks: 1 - items * stages / (stages * ticks).
  double bubble() const;
};

ScheduleTimeline simulate_schedule(const std::vector<StepPlan>& plans, int n_stages);

// One line per stage ("stage 0 | s0 s1 .  ."), a cell per tick: the item's label or '.' when idle.
std::vector<std::string> chart_lines(const ScheduleTimeline& timeline, const std::vector<StepPlan>& plans);

// A cell's label: "s3" (scoring, microbatch 3), "p1" (the prefill of microbatch 1), "d2.1" (decode
// step 2 of microbatch 1), "m7" (item 7, prompt chunks and decode rows).
std::string item_label(const StepPlan& plan);

// The GPipe bubble fraction (P-1)/(M+P-1).
double gpipe_bubble(int n_stages, int64_t n_micro);

}  // namespace lfm2
