#include "rank/report/benchmark_summary.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "rank/engine/schedule_chart.h"

namespace lfm2 {
double BenchmarkSummary::measured_bubble() const {
  double sum = 0;
  for (double b : busy_s) sum += b;
  return 1.0 - sum / (double(n_ranks) * wall_mean_s);
}

double BenchmarkSummary::busy_spread() const {
  double lo = 1e300, hi = 0;
  for (double b : busy_s) {
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  return hi > 0 ? (hi - lo) / hi : 0.0;
}

double BenchmarkSummary::busy_fraction() const { return 1.0 - measured_bubble(); }

double BenchmarkSummary::gpipe_bubble() const { return lfm2::gpipe_bubble(layout.n_stages, n_micro); }

std::vector<std::string> BenchmarkSummary::report() const {
  std::vector<std::string> lines;
  char buf[320];
  const int R = layout.n_replicas;
  if (R == 1) {
    std::snprintf(buf, sizeof buf,
                  "benchmark: %d ranks, %lld x %lld tokens in %lld microbatches of %lld, %d repetitions: "
                  "%.4f s mean, %.4f s best",
                  n_ranks, (long long)n_seq, (long long)seq_len, (long long)n_micro, (long long)microbatch, repeat,
                  wall_mean_s, wall_min_s);
  } else {
    std::string seqs, micros;  // "6 + 6", "3 + 3"
    for (const ReplicaWork& w : work) {
      seqs += cat(seqs.empty() ? "" : " + ", w.seqs.size());
      micros += cat(micros.empty() ? "" : " + ", w.n_micro(), " of ", w.microbatch);
    }
    std::snprintf(buf, sizeof buf,
                  "benchmark: %d ranks (%d replicas x %d stages), %lld x %lld tokens: %s sequences in %s "
                  "microbatches, %d repetitions: %.4f s mean, %.4f s best",
                  n_ranks, R, layout.n_stages, (long long)n_seq, (long long)seq_len, seqs.c_str(), micros.c_str(),
                  repeat, wall_mean_s, wall_min_s);
  }
  lines.push_back(buf);
  std::snprintf(buf, sizeof buf, "benchmark: %.1f samples/s, %.1f tokens/s", samples_per_s(), tokens_per_s());
  lines.push_back(buf);
  for (int r = 0; r < n_ranks; ++r) {
    const int stage = layout.stage_of[size_t(r)];
    const StageLayers& p = stages[size_t(stage)];
    const std::string who =
        R == 1 ? cat("stage ", stage) : cat("replica ", layout.replica_of[size_t(r)], " stage ", stage);
    std::snprintf(buf, sizeof buf, "benchmark: %s (layers %d-%d): busy %.4f s, %.1f%% of the wall time", who.c_str(),
                  p.layer_begin, p.layer_end - 1, busy_s[size_t(r)], 100.0 * busy_s[size_t(r)] / wall_mean_s);
    lines.push_back(buf);
  }
  std::snprintf(buf, sizeof buf,
                "benchmark: bubble %.1f%% measured (1 - sum busy / (%s * wall)), GPipe (P-1)/(M+P-1) = %.1f%%",
                100.0 * measured_bubble(), R == 1 ? "P" : "ranks", 100.0 * gpipe_bubble());
  lines.push_back(buf);
  std::snprintf(buf, sizeof buf, "benchmark: busy spread %.1f%% (busiest vs idlest stage), busy / wall %.3f",
                100.0 * busy_spread(), busy_fraction());
  lines.push_back(buf);
  return lines;
}

}  // namespace lfm2
