// Step plans as data: their rows, names and bytes, the executor's batch they make, and the flat
// buffer they travel in.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "rank/engine/stage_steps.h"
#include "rank/engine/step_plan.h"

namespace lfm2 {
namespace {

StepPlan decode_plan() {
  StepPlan p;
  p.item = 7;
  p.kind = StepPlan::Kind::kDecode;
  p.micro = 1;
  p.seqs = {{4, 4, 9, 1, 1, 2, true}, {5, 5, 6, 1, 1, 2, true}, {-3, 1 << 30, 1 << 30, 1, 1, 2, true}};
  p.feedback_from = 4;
  p.feedback_slot = 1;
  p.feeds_slot = 1;
  p.emit_offset = 11;
  p.ids_offset = 1LL << 33;
  return p;
}

// Continuous batching's kind: decode rows, then prompt chunks, pages, host-fed tokens, sampling.
StepPlan mixed_plan() {
  StepPlan p;
  p.item = 1LL << 35;
  p.micro = -1;
  p.seqs = {{12, 3, 40, 1, 1, 7, true}, {9, 0, 16, 8, 8, 0, false}, {13, 1, 0, 16, 16, -1, false}};
  p.kind = generation_kind(p.seqs);
  p.grants = {{0, 1, 5}, {0, 2, 6}, {1, 0, 9}};
  p.fed = {77};
  p.sampling = {{0.5f, 40, 0.9f, 1ULL << 60}, {0, 0, 1, 3}};
  p.reports = true;
  return p;
}

TEST(StepPlan, RowsNameAndHiddenBytes) {
  StepPlan p;
  p.kind = StepPlan::Kind::kScore;
  p.micro = 2;
  p.seqs = {{0, 0, 0, 6, 6}, {1, 1, 0, 6, 2}};
  EXPECT_EQ(p.rows(), 12);
  EXPECT_EQ(p.name(), "microbatch 2");
  EXPECT_EQ(item_bytes(p, 8, DType::F32), size_t(12 * 8 * 4));
  EXPECT_EQ(item_bytes(p, 8, DType::BF16), size_t(12 * 8 * 2));
  // A generation item's buffer carries its decode entries' finished flags after the rows.
  const StepPlan d = decode_plan();
  EXPECT_EQ(d.name(), "step 2 of microbatch 1");
  EXPECT_EQ(item_bytes(d, 8, DType::F32), size_t(decode_buffer_floats(3, 8)) * sizeof(float));
  EXPECT_EQ(feedback_bytes(d), 3 * sizeof(int32_t));
  const StepPlan m = mixed_plan();
  EXPECT_EQ(m.kind, StepPlan::Kind::kMixed);
  EXPECT_EQ(m.name(), "item 34359738368");
  EXPECT_EQ(m.rows(), 25);
  EXPECT_EQ(m.n_decode(), 1);
  EXPECT_EQ(m.n_emit(), 2);
  EXPECT_EQ(item_bytes(m, 8, DType::F32), size_t(25 * 8 + 1) * sizeof(float));
  EXPECT_EQ(item_tokens(m, 8), 26);
  EXPECT_EQ(feedback_bytes(m), 2 * sizeof(int32_t));
}

TEST(StepPlan, MakesTheExecutorsBatchWithTheSequencesOffset) {
  const StepBatch b = batch_of(mixed_plan(), 100);
  ASSERT_EQ(b.seqs.size(), 3u);
  EXPECT_TRUE((b.seqs[0] == BatchSeq{112, 3, 40, 1, 7, true}));
  EXPECT_TRUE((b.seqs[1] == BatchSeq{109, 0, 16, 8, 0, false}));
  EXPECT_TRUE((b.seqs[2] == BatchSeq{113, 1, 0, 16, -1, false}));
  EXPECT_EQ(b.n_decode(), 1);
  EXPECT_EQ(b.n_emit(), 2);
  EXPECT_NO_THROW(b.check(4, 64));
}

TEST(StepPlan, TravelsAsASmallFlatBuffer) {
  for (const StepPlan& p : {decode_plan(), mixed_plan()}) {
    const std::vector<uint8_t> bytes = to_bytes(p);
    EXPECT_EQ(bytes.size(), 76u + 32u * 3u + 12u * p.grants.size() + 4u * p.fed.size() + 20u * p.sampling.size());
    EXPECT_EQ(bytes[4], uint8_t(p.item));  // the item, least significant byte first
    const StepPlan back = plan_from_bytes(bytes.data(), bytes.size());
    EXPECT_TRUE(back == p);
  }
  const StepPlan back = plan_from_bytes(to_bytes(mixed_plan()).data(), to_bytes(mixed_plan()).size());
  EXPECT_EQ(back.item, 1LL << 35);
  EXPECT_EQ(back.sampling[0].seed, 1ULL << 60);
  EXPECT_EQ(back.sampling[0].top_p, 0.9f);
  EXPECT_EQ(decode_plan().seqs[2].slot, 1 << 30);
  StepPlan empty;
  const std::vector<uint8_t> e = to_bytes(empty);
  EXPECT_EQ(e.size(), 76u);
  EXPECT_TRUE(plan_from_bytes(e.data(), e.size()) == empty);
}

TEST(StepPlan, AWrongBufferIsRefused) {
  std::vector<uint8_t> bytes = to_bytes(decode_plan());
  EXPECT_THROW(plan_from_bytes(bytes.data(), bytes.size() - 1), Error);
  EXPECT_THROW(plan_from_bytes(bytes.data(), 10), Error);
  bytes[0] ^= 1;
  EXPECT_THROW(plan_from_bytes(bytes.data(), bytes.size()), Error);
  bytes = to_bytes(decode_plan());
  bytes[12] = 9;  // the kind
  EXPECT_THROW(plan_from_bytes(bytes.data(), bytes.size()), Error);
}

}  // namespace
}  // namespace lfm2
