// The benchmarks of the two jobs (--benchmark): warm-up, then timed repetitions between barriers of
// the whole job, so that rank 0's wall time covers every rank's work.
#include "rank/jobs/benchmarks.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "rank/mpi/poll.h"
#include "rank/report/run_report.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One run between two barriers: rank 0's wall time covers every rank's work; busy is this rank's.
struct Timed {
  double wall_s = 0, busy_s = 0;
};
Timed timed_run(RankSetup& s, GenerateJob& job) {
  barrier(s.world, s.opt.timeout_s, "a barrier between generation runs");
  const double t0 = now_s();
  const StageTiming t = s.pipeline->run(job.schedule(), job.memory());
  barrier(s.world, s.opt.timeout_s, "a barrier between generation runs");
  return {now_s() - t0, t.busy_s};
}

std::vector<double> gather_busy(const WorldConfig& world, double mine, double timeout_s) {
  std::vector<double> all(size_t(world.size), 0.0);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, world.comm, &req), "gathering busy times");
  wait_mpi_request(&req, timeout_s, "gathering busy times");
  return all;
}

}  // namespace

// --benchmark: warm-up, then `repeat` times the whole generation and the prefill alone (its first
// token: the time to first token); decode is the difference. Rank 0 prints the lines.
std::vector<std::string> benchmark_generation(RankSetup& s, GenerateJob& job) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, K = job.shape().max_new_tokens;
  for (int i = 0; i < opt.warmup; ++i) timed_run(s, job);
  Timed full, first;
  for (int i = 0; i < opt.repeat; ++i) {
    job.set_steps(K);
    const Timed a = timed_run(s, job);
    job.set_steps(1);
    const Timed b = timed_run(s, job);
    full.wall_s += a.wall_s / opt.repeat;
    full.busy_s += a.busy_s / opt.repeat;
    first.wall_s += b.wall_s / opt.repeat;
    first.busy_s += b.busy_s / opt.repeat;
    if (s.world.is_first()) log_info(cat("benchmark: repetition ", i + 1, "/", opt.repeat, ": ", a.wall_s, " s"));
  }
  job.set_steps(K);
  const std::vector<double> busy_all = gather_busy(s.world, full.busy_s, opt.timeout_s);
  const std::vector<double> busy_first = gather_busy(s.world, first.busy_s, opt.timeout_s);
  std::vector<std::string> lines;
  const double decode_s = full.wall_s - first.wall_s;
  const int R = s.layout.n_replicas;
  lines.push_back(cat("benchmark: generation of ", N, " x ", K, " tokens after ", s.seq_len, "-token prompts, ",
                      R > 1 ? cat(R, " replicas x ", s.layout.n_stages, " stages, ") : std::string(), "microbatch ",
                      s.microbatch, ": ", fixed(full.wall_s, 4), " s, ", fixed(double(N * K) / full.wall_s, 1),
                      " tokens/s"));
  lines.push_back(cat("benchmark: time to first token (prefill of all prompts) ", fixed(first.wall_s, 4), " s; decode ",
                      fixed(decode_s, 4), " s for ", N * (K - 1), " tokens: ",
                      fixed(decode_s > 0 ? double(N * (K - 1)) / decode_s : 0, 1), " tokens/s"));
  std::string busy = "benchmark: busy per stage during decode";
  double sum = 0;
  for (int r = 0; r < s.world.size; ++r) {
    const double b = busy_all[size_t(r)] - busy_first[size_t(r)];
    sum += b;
    const std::string who = s.layout.n_replicas == 1 ? std::string()
                                                     : cat("replica ", s.layout.replica_of[size_t(r)], " stage ",
                                                           s.layout.stage_of[size_t(r)], " ");
    busy += cat(r ? ", " : " ", who, fixed(b, 4), " s (", fixed(decode_s > 0 ? 100 * b / decode_s : 0, 1), "%)");
  }
  lines.push_back(busy);
  lines.push_back(cat("benchmark: decode bubble ",
                      fixed(decode_s > 0 ? 100 * (1 - sum / (s.world.size * decode_s)) : 0, 1),
                      "% (1 - sum busy / (P * decode wall))"));
  return lines;
}

BenchmarkSummary benchmark_scoring(RankSetup& setup, ScoreJob& job) {
  const WorldConfig& world = setup.world;
  const std::vector<ReplicaWork>& work = setup.work;
  Pipeline& pipeline = *setup.pipeline;
  const int warmup = setup.opt.warmup, repeat = setup.opt.repeat;
  const double timeout_s = setup.opt.timeout_s;
  LFM2_CHECK(repeat >= 1, "--repeat must be at least 1");
  BenchmarkSummary s;
  s.n_ranks = world.size;
  s.layout = setup.layout;
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
  s.plans = setup.plans;
  for (int i = 0; i < warmup; ++i) {
    if (world.is_first()) log_info(cat("benchmark: warm-up ", i + 1, "/", warmup));
    barrier(world, timeout_s, "the benchmark barrier");
    pipeline.run(job.schedule(), job.memory());
  }
  double busy = 0, wall_sum = 0, wall_min = 1e300;
  for (int i = 0; i < repeat; ++i) {
    barrier(world, timeout_s, "the benchmark barrier");
    const double t0 = now_s();
    busy += pipeline.run(job.schedule(), job.memory()).busy_s;
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
