#include "rank/engine/schedule_chart.h"

#include <algorithm>

#include "common/error.h"

namespace lfm2 {

double ScheduleTimeline::bubble() const {
  if (n_ticks == 0) return 0;
  const double busy = double(tick.empty() ? 0 : tick[0].size()) * n_stages;
  return 1.0 - busy / (double(n_stages) * double(n_ticks));
}

ScheduleTimeline simulate_schedule(const std::vector<StepPlan>& plans, int n_stages) {
  LFM2_CHECK(n_stages >= 1, "schedule chart: ", n_stages, " stages");
  const int64_t M = int64_t(plans.size());
  ScheduleTimeline t;
  t.n_stages = n_stages;
  t.tick.assign(size_t(n_stages), std::vector<int64_t>(size_t(M), 0));
  for (int64_t i = 0; i < M; ++i) {
    const StepPlan& p = plans[size_t(i)];
    LFM2_CHECK(p.feedback_from < i, "schedule chart: item ", i, " waits for item ", p.feedback_from);
    for (int r = 0; r < n_stages; ++r) {
      int64_t at = i > 0 ? t.tick[size_t(r)][size_t(i - 1)] + 1 : 0;  // the stage's previous item
      if (r > 0) at = std::max(at, t.tick[size_t(r - 1)][size_t(i)] + 1);  // the item from upstream
      if (r == 0 && p.feedback_from >= 0)  // the tokens it embeds, chosen by the last stage
        at = std::max(at, t.tick[size_t(n_stages - 1)][size_t(p.feedback_from)] + 1);
      t.tick[size_t(r)][size_t(i)] = at;
      t.n_ticks = std::max(t.n_ticks, at + 1);
    }
  }
  return t;
}

std::string item_label(const StepPlan& plan) {
  switch (plan.kind) {
    case StepPlan::Kind::kScore: return cat("s", plan.micro);
    case StepPlan::Kind::kPrefill: return cat("p", plan.micro);
    case StepPlan::Kind::kDecode: return cat("d", plan.seqs.empty() ? 0 : plan.seqs[0].gen_step, ".", plan.micro);
    case StepPlan::Kind::kMixed: return cat("m", plan.item);
  }
  return "?";
}

std::vector<std::string> chart_lines(const ScheduleTimeline& timeline, const std::vector<StepPlan>& plans) {
  size_t width = 1;
  for (const StepPlan& p : plans) width = std::max(width, item_label(p).size());
  std::vector<std::string> lines;
  for (int r = 0; r < timeline.n_stages; ++r) {
    std::vector<std::string> cells(size_t(timeline.n_ticks), ".");
    for (size_t i = 0; i < plans.size(); ++i) cells[size_t(timeline.tick[size_t(r)][i])] = item_label(plans[i]);
    std::string line = cat("stage ", r, " |");
    for (const std::string& c : cells) line += " " + c + std::string(width - c.size(), ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

double gpipe_bubble(int n_stages, int64_t n_micro) { return double(n_stages - 1) / double(n_micro + n_stages - 1); }

}  // namespace lfm2
