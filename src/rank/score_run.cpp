// Scoring: one pass of the pipeline (or a benchmark of it), validation against answers, the output.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"
#include "rank/benchmark.h"
#include "rank/fatal.h"
#include "rank/fault_hook.h"
#include "rank/jobs.h"
#include "rank/run_report.h"
#include "rank/validate.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ", smallest top-1 margin 0.012 (sequence 17)": how close the closest call of the run was.
std::string smallest_margin(const std::vector<float>& margin) {
  if (margin.empty()) return "";
  size_t at = 0;
  for (size_t i = 1; i < margin.size(); ++i)
    if (margin[i] < margin[at] || margin[at] != margin[at]) at = i;
  return cat("; smallest top-1 margin ", margin[at], " (sequence ", at, ")");
}

}  // namespace

nlohmann::json run_metadata(const RankSetup& s, int64_t n_items) {
  return {{"format", "lfm2-rank-outputs"},
          {"model", s.opt.model},
          {"inputs", s.opt.inputs},
          {"n_ranks", s.world.size},
          {"microbatch", s.microbatch},
          {"n_microbatches", n_items},
          {"layers", layer_counts(s.plans)},
          {"dtype", dtype_name(s.dtype)},
          {"tf32", s.use_cuda && s.opt.tf32},
          {"device", s.use_cuda ? "cuda" : "cpu"},
          {"created", utc_now()}};
}

JobOutcome run_scoring(RankSetup& s, ScoreJob& job) {
  const WorldConfig& world = s.world;
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, S = s.seq_len, M = job.shape().n_micro();
  if (world.is_first()) job.set_ids(s.inputs.ids.data());
  const double t0 = now_s();
  std::vector<std::string> bench_lines;
  if (opt.benchmark) {
    const BenchmarkSummary b = run_benchmark(world, *s.pipeline, job, s.plans, opt.warmup, opt.repeat, opt.timeout_s);
    if (world.is_first()) bench_lines = b.report();
  } else {
    // A traced run starts together on every rank, so that the ranks' timelines line up.
    if (!opt.trace.empty()) barrier(world, opt.timeout_s, "the trace's start");
    const StageTiming t = s.pipeline->run(job);
    const auto timing = gather_timing(world, t, opt.timeout_s);
    if (world.is_first()) bench_lines = pipeline_report(timing, s.plans, M);
  }
  const double run_s = now_s() - t0;
  for (const auto& l : bench_lines) log_info(l);
  if (!opt.trace.empty())
    deliver_trace(world, *s.pipeline, s.plans, opt.trace,
                  {{"job", "scoring"}, {"microbatch", s.microbatch}, {"microbatches", M}, {"sequences", N},
                   {"seq_len", S}, {"dtype", opt.dtype}},
                  opt.timeout_s);

  fault_point(world.rank, "output");
  JobOutcome out;
  if (world.is_last()) {
    PipelineResult result;
    job.take_results(&result);
    std::string head = "results: next_token =";
    for (int64_t i = 0; i < std::min<int64_t>(N, 8); ++i) head += cat(" ", result.next_token[size_t(i)]);
    out.lines.push_back(head + (N > 8 ? " ..." : "") + smallest_margin(result.margin));
    nlohmann::json meta = run_metadata(s, M);
    meta["all_logits"] = opt.all_logits;
    if (!opt.answers.empty()) {
      // TF32 keeps fp16's 10 mantissa bits, so a --tf32 run is held to fp16's tolerance.
      const DType vt = s.dtype == DType::F32 && s.use_cuda && opt.tf32 ? DType::F16 : s.dtype;
      const ValidationResult v =
          validate_outputs(result.next_token, result.logits, s.cfg.vocab_size, s.answers, tolerance_for(vt));
      for (const auto& l : v.report(vt)) out.lines.push_back(l);
      meta["validation"] = v.passed ? "PASS" : "FAIL";
      meta["top1_agree"] = v.agree;
      meta["max_abs_dlogit"] = v.max_abs_dlogit;
      meta["mean_abs_dlogit"] = v.mean_abs_dlogit;
      out.code = v.passed ? kExitOk : kExitValidationFailed;
    }
    if (!opt.output.empty()) {
      TokenOutputs o{N, S, s.cfg.vocab_size, result.next_token, result.logits, result.margin, result.all_logits, 0, {}, {}};
      // A write that fails (a full disk) is this rank's error alone: the job ends together, exit 1.
      try {
        write_outputs(opt.output, o, meta);
        out.lines.push_back("wrote " + opt.output);
      } catch (const std::exception& e) {
        log_error(e.what());
        out.code = std::max(out.code, kExitError);
      }
    }
  }
  if (!opt.benchmark) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "done: %lld sequences x %lld tokens in %.3f s (%.1f samples/s)", (long long)N,
                  (long long)S, run_s, double(N) / run_s);
    out.done = buf;
  }
  return out;
}

}  // namespace lfm2
