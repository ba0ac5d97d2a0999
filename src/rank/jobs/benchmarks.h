// The benchmarks of the two jobs (--benchmark): warm-up, timed repetitions, throughput, busy times
// and the bubble (the lines: report/benchmark_summary.h for scoring).
#pragma once

#include <string>
#include <vector>

#include "rank/jobs/generate_job.h"
#include "rank/jobs/job_setup.h"
#include "rank/jobs/score_job.h"
#include "rank/report/benchmark_summary.h"

namespace lfm2 {

// Runs `--warmup` untimed and `--repeat` timed repetitions of `job` (this rank's replica's) on every
// rank of the job; the summary is complete on rank 0. The job holds the last repetition's results.
BenchmarkSummary benchmark_scoring(RankSetup& setup, ScoreJob& job);

// Warm-up, then `--repeat` times the whole generation and the prefill alone (its first token: the
// time to first token); decode is the difference. The lines rank 0 prints.
std::vector<std::string> benchmark_generation(RankSetup& setup, GenerateJob& job);

}  // namespace lfm2
