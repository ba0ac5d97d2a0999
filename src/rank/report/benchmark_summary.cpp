#include "rank/report/benchmark_summary.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"
#include "rank/transport/transport.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


}  // namespace

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
    const StagePlan& p = plans[size_t(stage)];
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

BenchmarkSummary run_benchmark(const WorldConfig& world, const ReplicaLayout& layout,
                               const std::vector<ReplicaWork>& work, Pipeline& pipeline, ScoreJob& job,
                               const std::vector<StagePlan>& plans, int warmup, int repeat, double timeout_s) {
  LFM2_CHECK(repeat >= 1, "--repeat must be at least 1");
  BenchmarkSummary s;
  s.n_ranks = world.size;
  s.layout = layout;
  s.work = work;
  s.n_seq = work.back().seqs.end;
  s.seq_len = job.shape().seq_len;
  for (const ReplicaWork& w : work) s.seq_len = std::max(s.seq_len, w.width);
  const auto fewest = std::min_element(work.begin(), work.end(), [](const ReplicaWork& a, const ReplicaWork& b) {
    return a.n_micro() < b.n_micro();
  });
  s.n_micro = fewest->n_micro();
  s.microbatch = fewest->microbatch;
  s.repeat = repeat;
  s.plans = plans;
  for (int i = 0; i < warmup; ++i) {
    if (world.is_first()) log_info(cat("benchmark: warm-up ", i + 1, "/", warmup));
    barrier(world, timeout_s, "the benchmark barrier");
    pipeline.run(job);
  }
  double busy = 0, wall_sum = 0, wall_min = 1e300;
  for (int i = 0; i < repeat; ++i) {
    barrier(world, timeout_s, "the benchmark barrier");
    const double t0 = now_s();
    busy += pipeline.run(job).busy_s;
    barrier(world, timeout_s, "the benchmark barrier");
    const double wall = now_s() - t0;
    wall_sum += wall;
    wall_min = std::min(wall_min, wall);
    if (world.is_first()) log_info(cat("benchmark: repetition ", i + 1, "/", repeat, ": ", wall, " s"));
  }
  // Rank 0's wall time spans both barriers, so it covers every rank's work.
  s.wall_mean_s = wall_sum / repeat;
  s.wall_min_s = wall_min;
  double mine = busy / repeat;
  s.busy_s.assign(size_t(world.size), 0.0);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&mine, 1, MPI_DOUBLE, s.busy_s.data(), 1, MPI_DOUBLE, 0, world.comm, &req),
            "gathering stage times");
  wait_mpi_request(&req, timeout_s, "gathering stage times");
  return s;
}

}  // namespace lfm2
