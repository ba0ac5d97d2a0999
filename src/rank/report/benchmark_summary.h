// Benchmark mode's summary of scoring (the runs: jobs/scoring.cpp): throughput and the bubble.
//
// Each repetition starts at a barrier of the whole job and ends when every rank of every replica is
// done (a second barrier). Each stage's busy time (inside embed / forward / head) is gathered to
// rank 0, which prints samples/s, tokens/s, every stage's busy share and the measured bubble
// 1 - Σbusy / (ranks · wall) beside GPipe's (P-1)/(M+P-1) (with replicas, of the replica with the
// fewest microbatches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/layer_partition.h"
#include "plan/replica_work.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/replica_layout.h"

namespace lfm2 {

struct BenchmarkSummary {
  int n_ranks = 1;
  ReplicaLayout layout;
  std::vector<ReplicaWork> work;
  int64_t n_seq = 0, seq_len = 0;     // the whole job
  int64_t n_micro = 0, microbatch = 0;  // of the replica with the fewest microbatches
  int repeat = 0;
  double wall_mean_s = 0, wall_min_s = 0;
  std::vector<double> busy_s;  // per rank, mean over repetitions
  std::vector<StageLayers> stages;

  double samples_per_s() const { return double(n_seq) / wall_mean_s; }
  double tokens_per_s() const { return double(n_seq * seq_len) / wall_mean_s; }
  double measured_bubble() const;
  double gpipe_bubble() const;    // (P-1)/(M+P-1)
  double busy_spread() const;    // (busiest - idlest) / busiest stage
  double busy_fraction() const;  // sum busy / (P * wall) = 1 - measured_bubble()
  std::vector<std::string> report() const;  // the lines rank 0 prints
};

}  // namespace lfm2
