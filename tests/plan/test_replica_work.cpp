// The replicas' work: the split of the sequences into blocks, each replica's width and microbatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "plan/replica_work.h"

namespace lfm2 {
namespace {

std::vector<int64_t> sizes(const std::vector<SeqBlock>& blocks) {
  std::vector<int64_t> s;
  for (const SeqBlock& b : blocks) s.push_back(b.size());
  return s;
}

TEST(SplitSequences, EqualCostsDifferByAtMostOne) {
  EXPECT_EQ(sizes(split_sequences(std::vector<int64_t>(7, 9), 3)), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(sizes(split_sequences(std::vector<int64_t>(8, 9), 3)), (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(sizes(split_sequences(std::vector<int64_t>(6, 1), 3)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(split_sequences(std::vector<int64_t>(3, 5), 3)), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(sizes(split_sequences(std::vector<int64_t>(5, 5), 1)), (std::vector<int64_t>{5}));
  for (int64_t n = 1; n <= 40; ++n)
    for (int R = 1; R <= std::min<int64_t>(n, 8); ++R) {
      const auto s = sizes(split_sequences(std::vector<int64_t>(size_t(n), 3), R));
      EXPECT_LE(*std::max_element(s.begin(), s.end()) - *std::min_element(s.begin(), s.end()), 1) << n << "/" << R;
    }
}

TEST(SplitSequences, BalancedByTokens) {
  // Prompts of 9, 1, 5, 9, 3, 7 tokens (34): 15 + 19 beats 24 + 10.
  const auto b = split_sequences({9, 1, 5, 9, 3, 7}, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 3);
  EXPECT_EQ(b[1].end, 6);
  // One long prompt gets a replica of its own.
  EXPECT_EQ(sizes(split_sequences({1, 1, 1, 10}, 2)), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(sizes(split_sequences({10, 1, 1, 1, 1}, 2)), (std::vector<int64_t>{1, 4}));
  // Never an empty block, even when one sequence outweighs all the others.
  EXPECT_EQ(sizes(split_sequences({100, 1, 1}, 3)), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(sizes(split_sequences({1, 1, 100}, 3)), (std::vector<int64_t>{1, 1, 1}));
}

TEST(SplitSequences, FewerSequencesThanReplicasThrow) {
  try {
    split_sequences({4, 4}, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 sequences for 3 replicas"), std::string::npos) << e.what();
  }
}

TEST(SequenceCosts, PromptTokensPlusNewTokens) {
  EXPECT_EQ(sequence_costs(3, 9, {}, 0), (std::vector<int64_t>{9, 9, 9}));
  EXPECT_EQ(sequence_costs(3, 9, {2, 9, 5}, 4), (std::vector<int64_t>{6, 13, 9}));
}

TEST(PlanWork, WidthIsTheBlocksLongestPrompt) {
  const std::vector<int32_t> lengths{9, 1, 5, 2, 3, 4};
  const auto w = plan_work({{0, 3}, {3, 6}}, 9, lengths, false, 2, 2, false);
  EXPECT_EQ(w[0].width, 9);
  EXPECT_EQ(w[1].width, 4);
  EXPECT_EQ(w[1].microbatch, 2);
  EXPECT_EQ(w[1].n_micro(), 2);
  // --all-logits writes every position: the full width.
  EXPECT_EQ(plan_work({{3, 6}}, 9, lengths, true, 0, 2, false)[0].width, 9);
  // The default microbatch is the replica's own: about 4 per stage on the CPU.
  EXPECT_EQ(plan_work({{0, 16}}, 9, {}, false, 0, 2, false)[0].microbatch, 2);
  // --microbatch larger than a block is the block.
  EXPECT_EQ(plan_work({{0, 3}}, 9, {}, false, 100, 1, false)[0].microbatch, 3);
  // Generation: P groups holding every sequence, on either backend.
  EXPECT_EQ(plan_work({{0, 32}}, 8192, {}, false, 0, 1, true, true)[0].microbatch, 32);
  EXPECT_EQ(plan_work({{0, 256}}, 32, {}, false, 0, 4, true, true)[0].microbatch, 64);
  EXPECT_EQ(plan_work({{0, 7}}, 9, {}, false, 0, 2, false, true)[0].microbatch, 4);
  EXPECT_EQ(plan_work({{0, 7}}, 9, {}, false, 3, 2, false, true)[0].microbatch, 3);
}

}  // namespace
}  // namespace lfm2
