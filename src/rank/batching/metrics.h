// The metrics of a continuous generation run (--metrics FILE.json; --benchmark's lines), from the
// finished sequences' times and the scheduler's counters. An offline job's requests all arrive at
// the run's start, so a sequence's time to first token counts from there (and, beside it, from when
// its replica queued it); its time per output token is (finished - first token) / (tokens - 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rank/batching/batch_scheduler.h"

namespace lfm2 {

struct Quantiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  int64_t n = 0;
};
// Nearest-rank quantiles of v (empty: zeros).
Quantiles quantiles(std::vector<double> v);

struct RunMetrics {
  double wall_s = 0;
  int64_t sequences = 0, prompt_tokens = 0, new_tokens = 0;
  Quantiles ttft_s, ttft_from_queue_s, tpot_s, latency_s;
  Quantiles itl_s;  // every token after a sequence's first: the time since its previous (replica 0)
  // replica 0's items by kind: how many, and their times from the item before coming back
  int64_t prompt_items = 0, decode_items = 0;
  double prompt_items_s = 0, decode_items_s = 0;
  int64_t preemptions = 0, steps = 0;
  double slot_occupancy = 0;  // replica 0's: running sequences per step over its slots
  int64_t slots = 0;
  // The memory floor (GPU, --benchmark): every step reads its stage's weights and its decode rows'
  // cached KV at the copy bandwidth; the slowest stage's sum over replica 0's steps.
  double floor_s = 0;
};

// Replica 0's stages as the floor sees them: per stage its weight bytes, KV bytes per cached
// position, copy bandwidth (bytes/s; 0: unknown).
struct FloorStage {
  double weight_bytes = 0, kv_bytes_per_position = 0, bandwidth = 0;
};
// Sum over steps of (weights + KV read) / bandwidth on the slowest stage (0 where unknown).
double memory_floor_s(const std::vector<FloorStage>& stages, const SchedulerStats& st);

double slot_occupancy(const SchedulerStats& st, int64_t n_slots);
RunMetrics run_metrics(const std::vector<FinishedSeq>& finished, const SchedulerStats& st, int64_t n_slots,
                       double wall_s);
// "benchmark: ..." lines: throughput, time between tokens (mean, p50, p99), time to first token,
// the inter-token latency, the time of the items with prompt rows and of those of decode rows alone.
std::vector<std::string> benchmark_lines(const RunMetrics& m, int64_t n_seq, int n_replicas);
// Written atomically (a temporary name, then renamed).
void write_metrics(const std::string& path, const RunMetrics& m);

}  // namespace lfm2
