// Scoring: one pass of the pipeline (or a benchmark of it), validation against answers, the output.
#include <algorithm>
#include <cstdio>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/jobs/job_setup.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/report/benchmark_summary.h"
#include "rank/report/result_gather.h"
#include "rank/report/run_report.h"
#include "rank/report/trace_file.h"
#include "rank/report/validate.h"

namespace lfm2 {
namespace {

// ", smallest top-1 margin 0.012 (sequence 17)": how close the closest call of the run was.
std::string smallest_margin(const std::vector<float>& margin) {
  if (margin.empty()) return "";
  size_t at = 0;
  for (size_t i = 1; i < margin.size(); ++i)
    if (margin[i] < margin[at] || margin[at] != margin[at]) at = i;
  return cat("; smallest top-1 margin ", margin[at], " (sequence ", at, ")");
}

// Every replica's results, in input order, on the job's last rank (report/result_gather.h).
PipelineResult gather_scores(const RankSetup& s, const ScoreJob& job) {
  PipelineResult mine;
  if (s.pipe.is_last()) job.take_results(&mine);
  if (s.layout.n_replicas == 1) return mine;
  const PipelineShape& sh = job.shape();
  PipelineResult all;
  ResultGather g(s.world, s.layout, s.blocks());
  g.add(mine.next_token, 1, &all.next_token);
  g.add(mine.margin, 1, &all.margin);
  if (sh.logits) g.add(mine.logits, sh.vocab, &all.logits);
  if (sh.all_logits) g.add(mine.all_logits, sh.seq_len * sh.vocab, &all.all_logits);
  g.run(s.opt.timeout_s);
  return all;
}

// --benchmark: `--warmup` untimed and `--repeat` timed repetitions of the job (this rank's replica's)
// between barriers of the whole job, so that rank 0's wall time covers every rank's work; the
// summary is complete on rank 0. The job holds the last repetition's results.
BenchmarkSummary benchmark(RankSetup& setup, ScoreJob& job) {
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
  s.stages = setup.stages;
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

// The last rank's part: the results line, validation against --answers, --output.
JobOutcome score_outcome(const RankSetup& s, const PipelineResult& result) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq;
  JobOutcome out;
  std::string head = "results: next_token =";
  for (int64_t i = 0; i < std::min<int64_t>(N, 8); ++i) head += cat(" ", result.next_token[size_t(i)]);
  out.lines.push_back(head + (N > 8 ? " ..." : "") + smallest_margin(result.margin));
  nlohmann::json meta = run_metadata(s);
  meta["all_logits"] = opt.all_logits;
  if (!opt.answers.empty()) {
    // TF32 keeps fp16's 10 mantissa bits, so a --tf32 run is held to fp16's tolerance.
    const DType vt = s.dtype == DType::F32 && s.use_cuda && opt.tf32 ? DType::F16 : s.dtype;
    const ValidationResult v =
        validate_outputs(result.next_token, result.logits, s.cfg.vocab_size, s.answers, tolerance_for(vt));
    for (const auto& l : v.report(vt)) out.lines.push_back(l);
    for (const auto& l : replica_score_lines(s.layout, s.work, result.next_token, result.logits, s.cfg.vocab_size,
                                             s.answers, tolerance_for(vt)))
      out.lines.push_back(l);
    meta["validation"] = v.passed ? "PASS" : "FAIL";
    meta["top1_agree"] = v.agree;
    meta["max_abs_dlogit"] = v.max_abs_dlogit;
    meta["mean_abs_dlogit"] = v.mean_abs_dlogit;
    out.code = v.passed ? kExitOk : kExitValidationFailed;
  }
  if (!opt.output.empty()) {
    TokenOutputs o = job_outputs(s);
    o.next_token = result.next_token;
    o.logits = result.logits;
    o.margin = result.margin;
    o.all_logits = result.all_logits;
    write_job_outputs(opt.output, o, meta, out);
  }
  return out;
}

}  // namespace

JobOutcome run_scoring(RankSetup& s, ScoreJob& job) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, S = s.seq_len;
  if (s.pipe.is_first()) job.set_ids(s.inputs.ids.data());
  const double t0 = now_s();
  std::vector<std::string> lines;
  if (opt.benchmark) {
    const BenchmarkSummary b = benchmark(s, job);
    if (s.world.is_first()) lines = b.report();
  } else {
    lines = run_once(s, job.schedule(), job.memory(), 1);
  }
  const double run_s = now_s() - t0;
  for (const auto& l : lines) log_info(l);
  const int trace_code =
      opt.trace.empty() ? kExitOk : deliver_job_trace(s, trace_meta(s, "scoring", job.shape().n_micro()));

  fault_point(s.world.rank, "output");
  const PipelineResult result = gather_scores(s, job);
  JobOutcome out = s.world.is_last() ? score_outcome(s, result) : JobOutcome{};
  out.code = std::max(out.code, trace_code);
  if (!opt.benchmark)
    out.done = cat("done: ", N, " sequences x ", S, " tokens in ", fixed(run_s, 3), " s (", fixed(double(N) / run_s, 1),
                   " samples/s)");
  return out;
}

}  // namespace lfm2
