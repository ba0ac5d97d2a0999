// Generation: prefill and pipelined decode (or a benchmark of them), validation of the tokens
// against answers, the output (generated, n_generated).
#include <algorithm>
#include <cstdio>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/jobs/job_setup.h"
#include "rank/jobs/text_front_end.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/mpi/world.h"
#include "rank/report/result_gather.h"
#include "rank/report/run_report.h"
#include "rank/report/trace_file.h"
#include "rank/report/validate.h"

namespace lfm2 {
namespace {

}  // namespace

// Every replica's tokens, in input order, on the job's last rank (report/result_gather.h).
GenerateResult gather_generated(const RankSetup& s, const GenerateResult& mine, int64_t n_new) {
  if (s.layout.n_replicas == 1) return mine;
  GenerateResult all;
  all.n_new = n_new;
  ResultGather g(s.world, s.layout, s.blocks());
  g.add(mine.generated, all.n_new, &all.generated);
  g.add(mine.n_generated, 1, &all.n_generated);
  g.run(s.opt.timeout_s);
  return all;
}

namespace {

GenerateResult gather_tokens(const RankSetup& s, const GenerateJob& job) {
  GenerateResult mine;
  if (s.pipe.is_last()) job.take_results(&mine);
  return gather_generated(s, mine, job.shape().max_new_tokens);
}

// The decode steps after a sequence's EOS skip the experts (StageExecutor::decode): how many.
std::string finished_line(const GenerateResult& r, int64_t N, int64_t K) {
  int64_t ended = 0, skipped = 0;
  for (int64_t s = 0; s < N; ++s) {
    const int64_t n = r.n_generated[size_t(s)];
    ended += n < K;
    skipped += K - n;
  }
  return cat("results: ", ended, " of ", N, " sequences ended at an EOS before ", K, " tokens; ", skipped, " of ",
             N * (K - 1), " decode sequence-steps left out the experts");
}

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

// --benchmark: warm-up, then `repeat` times the prefill alone (its first token: the time to first
// token) and the whole generation; decode is the difference. Rank 0 prints the lines; --trace
// shows the last whole generation, decode included.
std::vector<std::string> benchmark(RankSetup& s, GenerateJob& job) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, K = job.shape().max_new_tokens;
  for (int i = 0; i < opt.warmup; ++i) timed_run(s, job);
  Timed full, first;
  for (int i = 0; i < opt.repeat; ++i) {
    // The prefill alone first, so that the last run (what --trace shows) is the whole generation.
    job.set_steps(1);
    const Timed b = timed_run(s, job);
    job.set_steps(K);
    const Timed a = timed_run(s, job);
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
                      fixed(decode_s > 0 ? double(N * (K - 1)) / decode_s : 0, 1), " tokens/s; time between tokens ",
                      fixed(K > 1 ? 1000 * decode_s / double(K - 1) : 0, 3), " ms (mean; the continuous scheduler's "
                      "benchmark gives p50 / p99 and the memory floor)"));
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

}  // namespace

// The last rank's part: sequence 0's tokens, how many sequences ended early, validation against
// --answers, --output (next_token is each sequence's first new token).
JobOutcome generation_outcome(const RankSetup& s, const GenerateResult& result) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, K = result.n_new;
  JobOutcome out;
  std::string head = "results: sequence 0 generated";
  for (int64_t t = 0; t < std::min<int64_t>(K, 12); ++t) head += cat(" ", result.generated[size_t(t)]);
  out.lines.push_back(head + (K > 12 ? " ..." : ""));
  if (!opt.eos.empty()) out.lines.push_back(finished_line(result, N, K));
  nlohmann::json meta = run_metadata(s);
  meta["max_new_tokens"] = K;
  meta["temperature"] = opt.temperature;
  meta["top_k"] = opt.top_k;
  meta["top_p"] = opt.top_p;
  meta["seed"] = int64_t(opt.seed);
  meta["eos"] = opt.eos;  // a JSON list ("[]": none), which lfm2_text.py decode stops at
  meta["eos_source"] = opt.eos_off ? "--eos none" : opt.eos_source;
  if (!s.answers.generated.empty()) {
    const bool exact = s.dtype == DType::F32 && !(s.use_cuda && opt.tf32) && opt.temperature <= 0;
    const GenerationCheck c = check_generated(result.generated, K, s.answers, exact);
    for (const auto& l : c.report()) out.lines.push_back(l);
    for (const auto& l : replica_generation_lines(s.layout, s.work, result.generated, K, s.answers, exact))
      out.lines.push_back(l);
    meta["validation"] = c.passed ? "PASS" : "FAIL";
    meta["tokens_equal"] = c.equal;
    out.code = c.passed ? kExitOk : kExitValidationFailed;
  }
  if (!opt.output.empty()) {
    TokenOutputs o = job_outputs(s);
    o.next_token.resize(size_t(N));
    for (int64_t i = 0; i < N; ++i) o.next_token[size_t(i)] = result.generated[size_t(i * K)];
    o.n_new = K;
    o.generated = result.generated;
    o.n_generated = result.n_generated;
    o.copy_from = opt.inputs;  // the request fields, for lfm2_text.py decode (docs/text.md)
    o.copy_datasets = request_datasets();
    write_job_outputs(opt.output, o, meta, out);
  }
  if (!opt.results.empty() && out.code == kExitOk) {
    try {
      out.lines.push_back(decode_results(opt, opt.text_model));
    } catch (const std::exception& e) {
      log_error(e.what());
      out.code = kExitError;
    }
  }
  return out;
}

JobOutcome run_generation(RankSetup& s, GenerateJob& job) {
  const RankOptions& opt = s.opt;
  const int64_t N = s.n_seq, K = job.shape().max_new_tokens;
  if (s.pipe.is_first()) job.set_ids(s.inputs.ids.data());
  job.set_stream(opt.stream && s.pipe.is_last());  // every replica's last stage
  const double t0 = now_s();
  const std::vector<std::string> lines =
      opt.benchmark ? benchmark(s, job) : run_once(s, job.schedule(), job.memory(), job.steps());
  const double run_s = now_s() - t0;
  if (s.world.is_first())
    for (const auto& l : lines) log_info(l);
  int trace_code = kExitOk;
  if (!opt.trace.empty()) {
    nlohmann::json meta = trace_meta(s, "generation", job.shape().n_micro());
    meta["new_tokens"] = K;
    trace_code = deliver_job_trace(s, meta);
  }

  fault_point(s.world.rank, "output");
  const GenerateResult result = gather_tokens(s, job);
  JobOutcome out = s.world.is_last() ? generation_outcome(s, result) : JobOutcome{};
  out.code = std::max(out.code, trace_code);
  if (!opt.benchmark)
    out.done = cat("done: ", N, " sequences x ", K, " new tokens in ", fixed(run_s, 3), " s (",
                   fixed(double(N * K) / run_s, 1), " tokens/s)");
  return out;
}

}  // namespace lfm2
