#include "rank/jobs/schedulers.h"

#include <algorithm>

#include "common/error.h"
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

// Microbatch g's prompts, each padded to `width`, whose last stage emits token gen_step (-1: scores).
std::vector<SeqRows> prompts(int64_t g, int64_t n_seq, int64_t width, int64_t microbatch,
                             const std::vector<int32_t>& lengths, int32_t gen_step) {
  std::vector<SeqRows> seqs;
  for (int64_t s = g * microbatch; s < std::min(n_seq, (g + 1) * microbatch); ++s)
    seqs.push_back({s, s, 0, int32_t(width), length_of(lengths, s, width), gen_step});
  return seqs;
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
    p.seqs = prompts(m, n_seq, width, microbatch, lengths, -1);
    plans.push_back(std::move(p));
  }
  return plans;
}

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps) {
  check_shape(n_seq, width, microbatch, lengths);
  LFM2_CHECK(steps >= 1, "schedule: ", steps, " generation steps");
  const int64_t G = n_microbatches(n_seq, microbatch);
  std::vector<StepPlan> plans;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t g = 0; g < G; ++g) {
      StepPlan p;
      p.item = t * G + g;
      p.micro = g;
      p.feeds_slot = t + 1 < steps ? int32_t(g) : -1;
      if (t == 0) {
        p.kind = StepPlan::Kind::kPrefill;
        p.seqs = prompts(g, n_seq, width, microbatch, lengths, 0);
      } else {
        p.kind = StepPlan::Kind::kDecode;
        p.feedback_from = p.item - G;
        p.feedback_slot = int32_t(g);
        for (const SeqRows& s : prompts(g, n_seq, width, microbatch, lengths, int32_t(t)))
          p.seqs.push_back({s.seq, s.slot, int32_t(s.n_tokens + t - 1), 1, 1, int32_t(t)});
      }
      plans.push_back(std::move(p));
    }
  return plans;
}

}  // namespace lfm2
