// Step plans as data: their rows, names and bytes, and the flat buffer they travel in.
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
  p.seqs = {{4, 4, 9, 1, 1, 2}, {5, 5, 6, 1, 1, 2}, {-3, 1LL << 40, 1 << 30, 1, 1, 2}};
  p.feedback_from = 4;
  p.feedback_slot = 1;
  p.feeds_slot = 1;
  return p;
}

TEST(StepPlan, RowsNameAndHiddenBytes) {
  StepPlan p;
  p.kind = StepPlan::Kind::kPrefill;
  p.micro = 2;
  p.seqs = {{0, 0, 0, 6, 6, 0}, {1, 1, 0, 6, 2, 0}};
  EXPECT_EQ(p.rows(), 12);
  EXPECT_EQ(p.name(), "the prefill of microbatch 2");
  EXPECT_EQ(item_bytes(p, 8, DType::F32), size_t(12 * 8 * 4));
  EXPECT_EQ(item_bytes(p, 8, DType::BF16), size_t(12 * 8 * 2));
  // A decode item's buffer carries its finished flags after the rows.
  const StepPlan d = decode_plan();
  EXPECT_EQ(d.name(), "step 2 of microbatch 1");
  EXPECT_EQ(item_bytes(d, 8, DType::F32), size_t(decode_buffer_floats(3, 8)) * sizeof(float));
  EXPECT_EQ(feedback_bytes(d), 3 * sizeof(int32_t));
}

TEST(StepPlan, TravelsAsASmallFlatBuffer) {
  const StepPlan p = decode_plan();
  const std::vector<uint8_t> bytes = to_bytes(p);
  EXPECT_EQ(bytes.size(), 44u + 32u * 3u);
  EXPECT_EQ(bytes[4], 7);  // the item, least significant byte first
  const StepPlan back = plan_from_bytes(bytes.data(), bytes.size());
  EXPECT_TRUE(back == p);
  EXPECT_EQ(back.seqs[2].slot, 1LL << 40);
  StepPlan empty;
  const std::vector<uint8_t> e = to_bytes(empty);
  EXPECT_EQ(e.size(), 44u);
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
