// Replicas x pipeline, the pure part: grouping ranks into replicas by node, the split of the
// sequences into blocks, each replica's width and microbatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>

#include "common/error.h"
#include "plan/replica_work.h"

namespace lfm2 {
namespace {

using Ranks = std::vector<std::vector<int>>;

std::vector<int64_t> sizes(const std::vector<SeqBlock>& blocks) {
  std::vector<int64_t> s;
  for (const SeqBlock& b : blocks) s.push_back(b.size());
  return s;
}

TEST(GroupRanks, OneNodeConsecutiveRanks) {
  const ReplicaLayout l = group_ranks({0, 0, 0, 0, 0, 0}, 3);
  EXPECT_EQ(l.n_replicas, 2);
  EXPECT_EQ(l.ranks, (Ranks{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(l.replica_of, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(l.stage_of, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(l.rank_list(1), "ranks 3-5");
  EXPECT_EQ(group_ranks({0, 0}, 1).rank_list(1), "rank 1");
}

TEST(GroupRanks, OnePipelineIsEveryRankInOrder) {
  // Today's behaviour whatever the nodes: stage r is rank r.
  for (const std::vector<int>& nodes : {std::vector<int>{0, 0, 2, 2}, std::vector<int>{0, 1, 0, 1}}) {
    const ReplicaLayout l = group_ranks(nodes, 4);
    EXPECT_EQ(l.ranks, (Ranks{{0, 1, 2, 3}}));
  }
}

TEST(GroupRanks, ReplicasStayOnTheirNode) {
  // Ranks placed round-robin over two nodes (0, 2, 4, 6 on one, 1, 3, 5, 7 on the other): every
  // replica of two stages stays on one node, though its ranks are not consecutive.
  const ReplicaLayout l = group_ranks({0, 1, 0, 1, 0, 1, 0, 1}, 2);
  EXPECT_EQ(l.ranks, (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.rank_list(0), "ranks 0, 2");
}

TEST(GroupRanks, LeftoversSpanNodes) {
  // Nodes of 2, 4 and 2 ranks, pipelines of 4: the middle node holds one whole replica, the two
  // small nodes' ranks make the other (a packing in rank order would split both).
  const ReplicaLayout l = group_ranks({0, 0, 2, 2, 2, 2, 6, 6}, 4);
  EXPECT_EQ(l.ranks, (Ranks{{0, 1, 6, 7}, {2, 3, 4, 5}}));
  EXPECT_EQ(l.rank_list(0), "ranks 0, 1, 6, 7");
}

TEST(GroupRanks, EveryRankOnceStagesInRankOrder) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int P = 1 + int(rng() % 4), R = 1 + int(rng() % 5), n = R * P, n_nodes = 1 + int(rng() % 4);
    std::vector<int> nodes(static_cast<size_t>(n));
    for (int& x : nodes) x = int(rng() % uint32_t(n_nodes));
    const ReplicaLayout l = group_ranks(nodes, P);
    ASSERT_EQ(l.n_replicas, R);
    std::set<int> seen;
    int spanning = 0;
    std::vector<int> count(static_cast<size_t>(n_nodes), 0);
    for (int x : nodes) ++count[size_t(x)];
    int leftover = 0;
    for (int c : count) leftover += c % P;
    for (int r = 0; r < R; ++r) {
      const auto& ranks = l.ranks[size_t(r)];
      ASSERT_EQ(int(ranks.size()), P);
      EXPECT_TRUE(std::is_sorted(ranks.begin(), ranks.end()));
      for (int s = 0; s < P; ++s) {
        EXPECT_TRUE(seen.insert(ranks[size_t(s)]).second);
        EXPECT_EQ(l.replica_of[size_t(ranks[size_t(s)])], r);
        EXPECT_EQ(l.stage_of[size_t(ranks[size_t(s)])], s);
      }
      bool one_node = true;
      for (int x : ranks) one_node = one_node && nodes[size_t(x)] == nodes[size_t(ranks[0])];
      spanning += one_node ? 0 : 1;
      if (r > 0) {
        EXPECT_LT(l.ranks[size_t(r - 1)][0], ranks[0]);
      }
    }
    // Only the ranks no whole replica on their node could take span nodes.
    EXPECT_LE(spanning, leftover / P);
    EXPECT_EQ(l.stage_of[0], 0);
    EXPECT_EQ(l.replica_of[0], 0);
    EXPECT_EQ(l.stage_of[size_t(n - 1)], P - 1);  // the job's last rank writes the output
  }
}

TEST(GroupRanks, RanksThatDoNotDivideThrow) { EXPECT_THROW(group_ranks({0, 0, 0, 0}, 3), Error); }

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
}

}  // namespace
}  // namespace lfm2
