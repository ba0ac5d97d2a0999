#include "rank/jobs/schedulers.h"

#include <algorithm>

#include "common/error.h"
#include "model/step_layout.h"
#include "plan/microbatch.h"

namespace lfm2 {
namespace {

int32_t length_of(const std::vector<int32_t>& lengths, int64_t s, int64_t width) {
  return lengths.empty() ? int32_t(width) : lengths[size_t(s)];
}

void check_shape(int64_t n_seq, int64_t width, int64_t microbatch, const std::vector<int32_t>& lengths) {
  LFM2_CHECK(n_seq > 0 && width > 0 && microbatch > 0, "schedule: empty batch");
  LFM2_CHECK(lengths.empty() || int64_t(lengths.size()) == n_seq, "schedule: ", lengths.size(), " lengths for ",
             n_seq, " sequences");
}

// Microbatch g's sequences [begin, end).
std::pair<int64_t, int64_t> micro_range(int64_t g, int64_t n_seq, int64_t microbatch) {
  return {g * microbatch, std::min(n_seq, (g + 1) * microbatch)};
}

StepPlan prefill_item(int64_t g, int64_t n_seq, int64_t width, int64_t microbatch, const std::vector<int32_t>& lengths,
                      const StateShape& state) {
  StepPlan p;
  p.kind = StepPlan::Kind::kPrefill;
  const auto [b, e] = micro_range(g, n_seq, microbatch);
  for (int64_t s = b; s < e; ++s) {
    const int32_t n = length_of(lengths, s, width);
    p.seqs.push_back({s, int32_t(s), 0, n, n, 0, false});
    for (int64_t k = 0; k < state.max_pages; ++k)
      p.grants.push_back({int32_t(s), int32_t(k), int32_t(s * state.max_pages + k)});
  }
  return p;
}

StepPlan decode_item(int64_t g, int64_t t, int64_t n_seq, int64_t width, int64_t microbatch,
                     const std::vector<int32_t>& lengths) {
  StepPlan p;
  p.kind = StepPlan::Kind::kDecode;
  const auto [b, e] = micro_range(g, n_seq, microbatch);
  for (int64_t s = b; s < e; ++s)
    p.seqs.push_back({s, int32_t(s), int32_t(length_of(lengths, s, width) + t - 1), 1, 1, int32_t(t), true});
  return p;
}

}  // namespace

std::vector<StepPlan> score_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                     const std::vector<int32_t>& lengths) {
  check_shape(n_seq, width, microbatch, lengths);
  std::vector<StepPlan> plans;
  for (int64_t m = 0; m < n_microbatches(n_seq, microbatch); ++m) {
    StepPlan p;
    p.item = m;
    p.kind = StepPlan::Kind::kScore;
    p.micro = m;
    const auto [b, e] = micro_range(m, n_seq, microbatch);
    for (int64_t s = b; s < e; ++s) p.seqs.push_back({s, int32_t(s), 0, int32_t(width), length_of(lengths, s, width)});
    plans.push_back(std::move(p));
  }
  return plans;
}

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps,
                                          const StateShape& state) {
  check_shape(n_seq, width, microbatch, lengths);
  LFM2_CHECK(steps >= 1, "schedule: ", steps, " generation steps");
  LFM2_CHECK(state.n_slots >= n_seq && state.max_positions() >= width + steps - 1 &&
                 state.n_pages >= n_seq * state.max_pages,
             "schedule: a state of ", state.n_slots, " slots of ", state.max_positions(), " positions for ", n_seq,
             " sequences of ", width + steps - 1);
  const int64_t G = n_microbatches(n_seq, microbatch);
  std::vector<StepPlan> plans;
  int64_t emitted = 0;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t g = 0; g < G; ++g) {
      StepPlan p = t == 0 ? prefill_item(g, n_seq, width, microbatch, lengths, state)
                          : decode_item(g, t, n_seq, width, microbatch, lengths);
      p.item = t * G + g;
      p.micro = g;
      p.feeds_slot = t + 1 < steps ? int32_t(g) : -1;
      if (t > 0) {
        p.feedback_from = p.item - G;
        p.feedback_slot = int32_t(g);
      }
      p.emit_offset = emitted;
      emitted += p.n_emit();
      plans.push_back(std::move(p));
    }
  return plans;
}

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps) {
  return generation_schedule(n_seq, width, microbatch, lengths, steps, old_state_shape(n_seq, width + steps - 1));
}

}  // namespace lfm2
