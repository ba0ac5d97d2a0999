// The layer partition: balanced costs, the LFM2-8B-A1B split, optimality, --layers parsing, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>

#include "common/error.h"
#include "h5pack/presets.h"
#include "plan/gpu_costs.h"
#include "plan/layer_partition.h"
#include "plan/microbatch.h"

namespace lfm2 {
namespace {

double max_stage_cost(const std::vector<double>& costs, const std::vector<int>& counts) {
  double worst = 0;
  size_t i = 0;
  for (int c : counts) {
    double sum = 0;
    for (int k = 0; k < c; ++k) sum += costs[i++];
    worst = std::max(worst, sum);
  }
  return worst;
}

// The smallest possible maximum stage cost, by trying every set of cut points.
double brute_force_best(const std::vector<double>& costs, int n_ranks) {
  const int L = int(costs.size());
  double best = 1e300;
  std::vector<int> counts;
  std::function<void(int, int)> rec = [&](int start, int left) {
    if (left == 1) {
      counts.push_back(L - start);
      best = std::min(best, max_stage_cost(costs, counts));
      counts.pop_back();
      return;
    }
    for (int c = 1; start + c <= L - (left - 1); ++c) {
      counts.push_back(c);
      rec(start + c, left - 1);
      counts.pop_back();
    }
  };
  rec(0, n_ranks);
  return best;
}

TEST(Partition, FullModelFourRanksIsSixEach) {
  const ModelConfig cfg = synth_preset("lfm2-8b-a1b");
  const auto plans = default_stages(cfg, 4);
  ASSERT_EQ(plans.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(plans[r].layer_begin, 6 * r);
    EXPECT_EQ(plans[r].n_layers(), 6);
    EXPECT_EQ(plans[r].is_first(), r == 0);
    EXPECT_EQ(plans[r].is_last(), r == 3);
  }
}

TEST(Partition, EveryRankCountCoversAllLayersContiguously) {
  const ModelConfig cfg = synth_preset("lfm2-8b-a1b");
  const auto costs = layer_costs(cfg, 32);
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  const double biggest = *std::max_element(costs.begin(), costs.end());
  for (int P = 1; P <= 24; ++P) {
    const auto plans = default_stages(cfg, P);
    ASSERT_EQ(int(plans.size()), P);
    int next = 0;
    std::vector<int> counts;
    for (const auto& p : plans) {
      EXPECT_EQ(p.layer_begin, next) << "P=" << P;
      EXPECT_GE(p.n_layers(), 1) << "P=" << P;
      next = p.layer_end;
      counts.push_back(p.n_layers());
    }
    EXPECT_EQ(next, 24) << "P=" << P;
    // The head only adds to the last stage; without it the split is within one layer of ideal.
    const auto plain = partition_layers(costs, P);
    EXPECT_LE(max_stage_cost(costs, plain), total / P + biggest) << "P=" << P;
  }
  EXPECT_EQ(default_stages(cfg, 24).back().n_layers(), 1);
}

// On the GPU a top-4 MoE layer costs more than a dense one of the same FLOPs (grouped GEMMs,
// routing, permutation): the GPU model gives the stage with the two dense layers no fewer layers, keeps
// the estimated stages within one layer of each other, and charges attention for long sequences.
TEST(Partition, GpuCostModelBalancesTheDenseLayers) {
  const ModelConfig cfg = synth_preset("lfm2-8b-a1b");
  const auto costs = layer_costs(cfg, 32, CostModel::kGpu);
  EXPECT_LT(costs[0], costs[3]);  // conv + dense < conv + MoE
  const auto long_costs = layer_costs(cfg, 8192, CostModel::kGpu);
  EXPECT_GT(long_costs[2], long_costs[3]);  // attention + MoE > conv + MoE at 8192 tokens
  EXPECT_EQ(long_costs[3], costs[3]);       // conv does not grow with the sequence
  for (int P : {2, 3, 4, 6}) {
    const auto plans = default_stages(cfg, P, 32, false, CostModel::kGpu);
    std::vector<int> counts;
    for (const auto& p : plans) counts.push_back(p.n_layers());
    EXPECT_GE(counts[0], counts[1]) << "P=" << P;
    std::vector<double> stage(size_t(P), 0.0);
    for (int r = 0; r < P; ++r)
      for (int il = plans[size_t(r)].layer_begin; il < plans[size_t(r)].layer_end; ++il) stage[size_t(r)] += costs[il];
    stage.back() += head_cost(cfg, 32, false, CostModel::kGpu);
    const double biggest = *std::max_element(costs.begin(), costs.end());
    EXPECT_LE(*std::max_element(stage.begin(), stage.end()) - *std::min_element(stage.begin(), stage.end()), biggest)
        << "P=" << P;
  }
}

TEST(Partition, DefaultMicrobatch) {
  EXPECT_EQ(default_microbatch(32, 32, 4, false), 2);     // CPU: 4 per rank
  EXPECT_EQ(default_microbatch(1024, 32, 1, true), 512);  // one stage: no bubble, the biggest GEMMs
  EXPECT_EQ(default_microbatch(1024, 32, 2, true), 128);  // measured best on 2 x H200 (docs/results.md)
  EXPECT_EQ(default_microbatch(1024, 32, 4, true), 128);
  EXPECT_EQ(default_microbatch(1024, 32, 8, true), 64);   // more stages: a smaller bubble pays
  EXPECT_EQ(default_microbatch(32, 8192, 4, true), 1);    // one long sequence is already 8192 tokens
  EXPECT_EQ(default_microbatch(3, 32, 1, true), 3);
  for (int64_t t : {100, 1000, 3000, 5000, 10000, 20000})  // the efficiency curve rises
    EXPECT_LE(gpu_microbatch_efficiency(t), gpu_microbatch_efficiency(t + 1000));
}

TEST(Partition, MatchesBruteForceOnRandomCosts) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return double((state >> 33) % 1000 + 1);
  };
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 2 + trial % 8;
    std::vector<double> costs(L);
    for (auto& c : costs) c = next();
    for (int P = 1; P <= L; ++P) {
      const auto counts = partition_layers(costs, P);
      ASSERT_EQ(int(counts.size()), P);
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), L);
      EXPECT_DOUBLE_EQ(max_stage_cost(costs, counts), brute_force_best(costs, P)) << "trial " << trial << " P=" << P;
    }
  }
}

TEST(Partition, EqualCostsSplitEvenly) {
  const std::vector<double> costs(12, 1.0);
  EXPECT_EQ(partition_layers(costs, 4), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(partition_layers(costs, 5), (std::vector<int>{2, 2, 2, 3, 3}));
  // A heavy last stage (the LM head) takes fewer layers.
  EXPECT_EQ(partition_layers(costs, 2, 0.0, 2.0), (std::vector<int>{7, 5}));
}

TEST(Partition, RankCountsOutOfRangeThrow) {
  const std::vector<double> costs(6, 1.0);
  EXPECT_THROW(partition_layers(costs, 0), Error);
  EXPECT_THROW(partition_layers(costs, 7), Error);
  EXPECT_THROW(default_stages(synth_preset("lfm2-8b-a1b"), 25), Error);
}

TEST(ParseLayerCounts, AcceptsAnExactCover) {
  EXPECT_EQ(parse_layer_counts("6,6,6,6", 24, 4), (std::vector<int>{6, 6, 6, 6}));
  EXPECT_EQ(parse_layer_counts("5,7,7,5", 24, 4), (std::vector<int>{5, 7, 7, 5}));
  EXPECT_EQ(parse_layer_counts("24", 24, 1), (std::vector<int>{24}));
  const auto plans = make_stages(parse_layer_counts("1,5", 6, 2));
  EXPECT_EQ(plans[1].layer_begin, 1);
  EXPECT_EQ(plans[1].layer_end, 6);
}

TEST(ParseLayerCounts, RejectsBadSplits) {
  EXPECT_THROW(parse_layer_counts("6,6,6", 24, 4), Error);    // too few parts
  EXPECT_THROW(parse_layer_counts("6,6,6,5", 24, 4), Error);  // does not cover
  EXPECT_THROW(parse_layer_counts("6,6,6,7", 24, 4), Error);  // too many layers
  EXPECT_THROW(parse_layer_counts("6,x,6,6", 24, 4), Error);  // not a number
  EXPECT_THROW(parse_layer_counts("0,8,8,8", 24, 4), Error);  // empty stage
  EXPECT_THROW(parse_layer_counts("6,,6,6", 24, 4), Error);   // empty part
  EXPECT_THROW(parse_layer_counts("", 24, 1), Error);
}

}  // namespace
}  // namespace lfm2
