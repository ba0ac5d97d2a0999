// The jobs' schedulers without threads or MPI: item order, each item's sequences and rows, the
// feedback of generation, and the bubble of the timeline drawn from the plans alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "rank/engine/schedule_chart.h"
#include "rank/jobs/schedulers.h"
#include "rank/jobs/score_job.h"

namespace lfm2 {
namespace {

using Kind = StepPlan::Kind;

std::vector<int64_t> seqs_of(const StepPlan& p) {
  std::vector<int64_t> s;
  for (const SeqRows& r : p.seqs) s.push_back(r.seq);
  return s;
}

TEST(ScoreSchedule, OneItemPerMicrobatchInOrderTheLastShort) {
  const auto plans = score_schedule(10, 4, 4, {});
  ASSERT_EQ(plans.size(), 3u);
  for (int64_t m = 0; m < 3; ++m) {
    const StepPlan& p = plans[size_t(m)];
    EXPECT_EQ(p.item, m);
    EXPECT_EQ(p.micro, m);
    EXPECT_EQ(p.kind, Kind::kScore);
    EXPECT_EQ(p.feedback_from, -1);
    EXPECT_EQ(p.feeds_slot, -1);
    EXPECT_EQ(p.name(), cat("microbatch ", m));
  }
  EXPECT_EQ(seqs_of(plans[0]), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(seqs_of(plans[2]), (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(plans[2].rows(), 2 * 4);
}

TEST(ScoreSchedule, RaggedPromptsArePaddedToTheWidthAndReadAtTheirOwnLastToken) {
  const auto plans = score_schedule(3, 5, 2, {5, 1, 3});
  ASSERT_EQ(plans.size(), 2u);
  const SeqRows& b = plans[0].seqs[1];
  EXPECT_EQ(b.seq, 1);
  EXPECT_EQ(b.slot, 1);
  EXPECT_EQ(b.first_pos, 0);
  EXPECT_EQ(b.n_rows, 5);
  EXPECT_EQ(b.n_tokens, 1);
  EXPECT_EQ(b.gen_step, -1);
  EXPECT_EQ(plans[1].seqs[0].n_tokens, 3);
  EXPECT_THROW(score_schedule(3, 5, 2, {5, 1}), Error);
  EXPECT_THROW(score_schedule(0, 5, 2, {}), Error);
}

TEST(GenerationSchedule, StepMajorPrefillThenDecodeFedBackThroughTheMicrobatchSlot) {
  const int64_t N = 5, mb = 2, K = 3, G = 3;  // microbatches of 2, 2, 1
  const std::vector<int32_t> lengths = {4, 2, 3, 1, 4};
  const StateShape state{N, 3 * N, 16, 3};
  const auto plans = generation_schedule(N, 4, mb, lengths, K, state);
  ASSERT_EQ(int64_t(plans.size()), G * K);
  int64_t emitted = 0;
  for (int64_t i = 0; i < G * K; ++i) {
    const StepPlan& p = plans[size_t(i)];
    const int64_t t = i / G, g = i % G;
    EXPECT_EQ(p.item, i);
    EXPECT_EQ(p.micro, g);
    EXPECT_EQ(p.kind, t == 0 ? Kind::kPrefill : Kind::kDecode);
    EXPECT_EQ(p.feedback_from, t == 0 ? -1 : i - G) << "item " << i;
    EXPECT_EQ(p.feedback_slot, t == 0 ? -1 : g);
    EXPECT_EQ(p.feeds_slot, t + 1 < K ? g : -1) << "the last step feeds nobody";
    EXPECT_EQ(p.n_seqs(), g < 2 ? 2 : 1);
    EXPECT_EQ(p.emit_offset, emitted) << "the run's tokens, item after item";
    emitted += p.n_emit();
    for (const SeqRows& s : p.seqs) {
      const int32_t len = lengths[size_t(s.seq)];
      EXPECT_EQ(s.slot, s.seq);
      EXPECT_EQ(s.gen_step, t);
      EXPECT_EQ(s.decode, t > 0);
      // A prompt is its own tokens, unpadded; a decode row sits at the position after the tokens
      // before it: the prompt, then t - 1 new ones.
      EXPECT_EQ(s.n_rows, t == 0 ? len : 1);
      EXPECT_EQ(s.n_tokens, s.n_rows);
      EXPECT_EQ(s.first_pos, t == 0 ? 0 : len + t - 1);
    }
    // The prefill grants each of its slots every page it will use: slot s on pages 3s .. 3s + 2.
    EXPECT_EQ(p.grants.size(), t == 0 ? 3 * p.seqs.size() : 0u);
    for (size_t k = 0; k < p.grants.size(); ++k) {
      const PageGrant& pg = p.grants[k];
      EXPECT_EQ(pg.slot, p.seqs[k / 3].slot);
      EXPECT_EQ(pg.index, int32_t(k % 3));
      EXPECT_EQ(pg.page, 3 * pg.slot + pg.index);
    }
  }
  EXPECT_EQ(emitted, N * K);
  EXPECT_EQ(plans[0].name(), "the prefill of microbatch 0");
  EXPECT_EQ(plans[0].rows(), 4 + 2);
  EXPECT_EQ(plans[size_t(2 * G + 1)].name(), "step 2 of microbatch 1");
  EXPECT_EQ(plans[size_t(2 * G + 1)].rows(), 2);
  EXPECT_THROW(generation_schedule(N, 4, mb, lengths, 0, state), Error);
  EXPECT_THROW(generation_schedule(N, 4, mb, lengths, K, StateShape{N, 3 * N, 16, 0}), Error) << "no room";
}

// Prefill in chunks: every prompt row but the last in items of at most C rows (pieces of prompts
// at their positions), then one item of the last rows, which chooses every first token; the decode
// steps feed back from it; the prompt rows' ids run item after item.
TEST(GenerationSchedule, PrefillChunksThenTheLastRowsWhichFeedTheDecodeSteps) {
  const int64_t N = 5, mb = 3, K = 3, C = 4;  // microbatches of 3 and 2
  const std::vector<int32_t> lengths = {6, 1, 4, 5, 2};
  const StateShape state{N, N, 16, 1};
  const auto plans = generation_schedule(N, 6, mb, lengths, K, state, C);
  // Microbatch 0: body rows 5 + 0 + 3 = 8 -> items of 4 and 4, then the last rows; microbatch 1:
  // 4 + 1 = 5 -> 4 and 1, then the last rows; then 2 decode steps of 2 microbatches.
  ASSERT_EQ(plans.size(), 3u + 3u + 4u);
  std::vector<int64_t> ids_end(1, 0), rows_of(N, 0);
  for (size_t i = 0; i < plans.size(); ++i) {
    const StepPlan& p = plans[i];
    EXPECT_EQ(p.item, int64_t(i));
    EXPECT_LE(p.rows(), std::max<int64_t>(C, mb));
    if (p.kind == Kind::kPrefill) {
      EXPECT_EQ(p.ids_offset, ids_end.back()) << "item " << i << ": ids item after item";
      ids_end.push_back(p.ids_offset + p.rows());
      for (const SeqRows& r : p.seqs) {
        EXPECT_EQ(r.first_pos, rows_of[size_t(r.seq)]) << "item " << i << ": its rows in order";
        rows_of[size_t(r.seq)] += r.n_rows;
        EXPECT_EQ(r.gen_step, r.first_pos + r.n_rows == lengths[size_t(r.seq)] ? 0 : -1);
      }
    } else {
      EXPECT_EQ(p.ids_offset, -1);
    }
  }
  for (int64_t s = 0; s < N; ++s) EXPECT_EQ(rows_of[size_t(s)], lengths[size_t(s)]);
  EXPECT_EQ(plans[0].grants.size(), 3u) << "the microbatch's first item grants its pages";
  EXPECT_EQ(plans[2].n_emit(), 3);
  EXPECT_EQ(plans[2].feeds_slot, 0);
  EXPECT_EQ(plans[0].feeds_slot, -1);
  EXPECT_EQ(plans[6].feedback_from, 2) << "step 1 of microbatch 0 embeds the last rows' tokens";
  EXPECT_EQ(plans[7].feedback_from, 5);
  EXPECT_EQ(plans[8].feedback_from, 6);
  EXPECT_EQ(plans[9].feedback_from, 7);
  EXPECT_EQ(plans[9].emit_offset, N * K - 2);
}

TEST(GenerationSchedule, OneStepIsThePrefillAloneFeedingNobody) {
  const auto plans = generation_schedule(4, 3, 2, {}, 1);
  ASSERT_EQ(plans.size(), 2u);
  for (const StepPlan& p : plans) {
    EXPECT_EQ(p.kind, Kind::kPrefill);
    EXPECT_EQ(p.feeds_slot, -1);
    EXPECT_EQ(p.seqs[0].n_tokens, 3);
    EXPECT_EQ(p.emit_offset, p.item * 2);
  }
}

// A pool's pages stop short of 2^31 positions (the CUDA kernels' 32-bit pool rows), and no sooner.
TEST(StateShape, APoolHoldsFewerThan2To31Positions) {
  for (int64_t page : {16, 256, 4096, 65536}) {
    const StateShape s{1, 1, page, 1};
    EXPECT_LT(s.max_pool_pages() * page, int64_t(1) << 31) << page;
    EXPECT_GE((s.max_pool_pages() + 1) * page, int64_t(1) << 31) << page;
  }
}

// Scoring's timeline is GPipe's fill and drain: its bubble is (P-1)/(M+P-1) for every M and P.
TEST(ScheduleBubble, ScoringIsGPipes) {
  for (int P : {1, 2, 3, 4})
    for (int64_t M : {1, 2, 3, 8}) {
      const auto plans = score_schedule(M, 2, 1, {});
      const ScheduleTimeline t = simulate_schedule(plans, P);
      EXPECT_EQ(t.n_ticks, M + P - 1);
      EXPECT_DOUBLE_EQ(t.bubble(), gpipe_bubble(P, M)) << P << " stages, " << M << " microbatches";
    }
}

// Generation: with at least as many microbatches as stages, decode steps follow each other without
// a gap after the fill; with fewer, each step waits for the last stage's tokens of the step before.
TEST(ScheduleBubble, GenerationStallsOnItsFeedbackWithFewerMicrobatchesThanStages) {
  const int P = 3;
  const int64_t K = 4;
  const auto full = simulate_schedule(generation_schedule(3, 2, 1, {}, K), P);
  EXPECT_EQ(full.n_ticks, 3 * K + P - 1);
  EXPECT_DOUBLE_EQ(full.bubble(), gpipe_bubble(P, 3 * K));
  const auto one = simulate_schedule(generation_schedule(1, 2, 1, {}, K), P);
  EXPECT_EQ(one.n_ticks, K * P);  // each step crosses every stage before the next may start
  EXPECT_DOUBLE_EQ(one.bubble(), 1.0 - 1.0 / P);
}

TEST(Bubble, GPipeFormula) {
  EXPECT_DOUBLE_EQ(gpipe_bubble(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(gpipe_bubble(4, 16), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(gpipe_bubble(4, 1), 0.75);
  PipelineShape s;
  s.n_seq = 10;
  s.microbatch = 4;
  EXPECT_EQ(s.n_micro(), 3);
  EXPECT_EQ(s.micro_size(2), 2);
}

}  // namespace
}  // namespace lfm2
