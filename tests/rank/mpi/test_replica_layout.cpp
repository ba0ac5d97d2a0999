// Replicas x pipeline: grouping ranks into replicas by node.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "common/error.h"
#include "rank/mpi/replica_layout.h"

namespace lfm2 {
namespace {

using Ranks = std::vector<std::vector<int>>;

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

}  // namespace
}  // namespace lfm2
