// Generation with continuous batching (continuous_job.h) over the whole job: every replica's first
// stage pulls sequences from the job's queue on rank 0 (job_hub.h), reads their prompts as it gets
// them (queue_source.h) and streams them through its scheduler; finished sequences go to rank 0,
// which journals them, shows the progress and at the end validates and writes the output
// (result_writer.h, generation.cpp's outcome) and the metrics (metrics.h).
#include <algorithm>
#include <map>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/batching/job_hub.h"
#include "rank/jobs/job_setup.h"
#include "rank/batching/metrics.h"
#include "rank/batching/queue_source.h"
#include "rank/jobs/result_writer.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/report/run_report.h"
#include "rank/report/trace_file.h"

namespace lfm2 {
namespace {

// What a resumed job must match: the model, the inputs, and every flag that changes a token.
nlohmann::json job_identity(const RankSetup& s) {
  const RankOptions& opt = s.opt;
  return {{"format", "lfm2-rank-journal-1"}, {"model", s.model_fingerprint}, {"inputs", s.inputs_fingerprint},
          {"sequences", s.n_seq},           {"max_new_tokens", opt.max_new_tokens},
          {"temperature", opt.temperature}, {"top_k", opt.top_k},
          {"top_p", opt.top_p},             {"seed", int64_t(opt.seed)},
          {"eos", opt.eos},                 {"dtype", dtype_name(s.dtype)},
          {"device", s.use_cuda ? "cuda" : "cpu"}, {"tf32", s.use_cuda && opt.tf32}};
}

}  // namespace

std::unique_ptr<ResultWriter> make_result_writer(const RankSetup& s, bool journal) {
  WriterOptions w;
  w.n_seq = s.n_seq;
  w.max_new_tokens = s.max_new_tokens;
  if (journal) w.output = s.opt.output;
  w.identity = job_identity(s);
  w.meta = run_metadata(s);
  w.meta["max_new_tokens"] = s.max_new_tokens;
  w.resume = journal && s.opt.resume;
  return std::make_unique<ResultWriter>(w);
}

namespace {

struct RunResult {
  double wall_s = 0;
  StageTiming timing;
  SchedulerStats sched;  // this replica's first stage
  int64_t n_pages = 0;
};

// One run of the job, between two barriers (rank 0's wall time covers every rank's work). Rank 0
// serves the queue and takes every replica's results into `writer`.
RunResult run_queue(RankSetup& s, ContinuousJob& job, ResultWriter* writer) {
  const RankOptions& opt = s.opt;
  const ContinuousShape& shape = job.shape();
  std::unique_ptr<JobHub> hub;
  std::unique_ptr<QueueSource> source;
  if (s.world.is_first()) {
    std::vector<int64_t> pending;
    for (int64_t q = 0; q < s.n_seq; ++q)
      if (!writer->done()[size_t(q)]) pending.push_back(q);
    hub = std::make_unique<HubServer>(s.world, s.layout, std::move(pending),
                                      [writer](FinishedSeq&& f, int r) { writer->add(std::move(f), r); }, opt.timeout_s);
  } else if (s.pipe.is_first()) {
    hub = std::make_unique<HubClient>(s.world, opt.timeout_s);
  }
  if (hub)
    source = std::make_unique<QueueSource>(*hub, opt.inputs, s.lengths, s.seq_len, s.settings, s.cfg.vocab_size,
                                           s.cfg.max_position_embeddings,
                                           std::max<int64_t>(16, shape.state.n_slots / 4));
  barrier(s.world, opt.timeout_s, "a barrier between generation runs");
  const double t0 = now_s();
  if (writer) writer->start();
  // Times relative to the run's start, which the barrier lines up across replicas.
  job.prepare(source.get(),
              [&](FinishedSeq&& f) {
                f.added_s -= t0, f.first_token_s -= t0, f.finished_s -= t0;
                hub->finished(std::move(f));
              },
              [&] {
                hub->serve();
                if (writer && job.scheduler_feed())
                  writer->tick(job.scheduler_feed()->scheduler().pages_in_use(), shape.state.n_pages);
              });
  RunResult r;
  r.timing = s.pipeline->run(job.feed(), job.memory());
  if (job.scheduler_feed()) r.sched = job.scheduler_feed()->scheduler().stats();
  if (hub) hub->replica_done();
  if (writer) writer->finish_run();
  barrier(s.world, opt.timeout_s, "a barrier between generation runs");
  r.wall_s = now_s() - t0;
  r.n_pages = shape.state.n_pages;
  return r;
}

// "continuous: 41 steps (...)": what replica 0's scheduler did.
std::string scheduler_line(const SchedulerStats& st, const ContinuousShape& shape) {
  return cat("continuous: ", st.items, " steps: ", st.decode_rows, " decode rows (", st.ahead_rows,
             " planned ahead, ", st.wasted_rows, " after an EOS), ", st.prompt_rows, " prompt rows, ", st.forced_rows,
             " recomputed decode rows; ", st.preemptions, " preemptions; ",
             "slot occupancy ", fixed(100 * slot_occupancy(st, shape.state.n_slots), 1), "% of ", shape.state.n_slots,
             " slots; pool ", shape.state.n_pages, " pages of ", shape.state.page_size);
}

// Replica 0's stages for the memory floor, on rank 0 (every rank takes part).
std::vector<FloorStage> floor_stages(const RankSetup& s, const ContinuousJob& job, StageExecutor& exec) {
  const int W = s.world.size;
  std::vector<int64_t> mine(size_t(3 * W), 0);
  const int64_t ps = job.shape().state.page_size;
  mine[size_t(3 * s.world.rank)] = s.stage_weight_bytes;
  mine[size_t(3 * s.world.rank + 1)] = exec.page_bytes(ps);
  mine[size_t(3 * s.world.rank + 2)] = int64_t(s.copy_bandwidth / 1e6);  // MB/s
  const std::vector<int64_t> all = allreduce_max(s.world, mine, s.opt.timeout_s, "the memory floor's figures");
  std::vector<FloorStage> f;
  for (int rank : s.layout.ranks[0])
    f.push_back({double(all[size_t(3 * rank)]), double(all[size_t(3 * rank + 1)]) / double(ps),
                 double(all[size_t(3 * rank + 2)]) * 1e6});
  return f;
}

// Rank 0's lines of a run: the pipeline's busy and bubble, the scheduler, the benchmark's figures.
std::vector<std::string> run_lines(const RankSetup& s, const RunResult& r, const ContinuousShape& shape,
                                   const ResultWriter* w, double timed_s, const std::vector<FloorStage>& floor) {
  const auto timing = gather_timing(s.world, s.layout, r.timing, s.opt.timeout_s);
  if (!s.world.is_first()) return {};
  std::vector<std::string> lines = replica_pipeline_report(timing, s.layout, s.work, s.stages, 1);
  lines.push_back(scheduler_line(r.sched, shape));
  if (s.opt.benchmark) {
    RunMetrics m = run_metrics(w->finished(), r.sched, shape.state.n_slots, timed_s);
    m.floor_s = memory_floor_s(floor, r.sched);
    for (const std::string& l : benchmark_lines(m, s.n_seq, s.layout.n_replicas)) lines.push_back(l);
  }
  return lines;
}

}  // namespace

JobOutcome run_continuous(RankSetup& s, ContinuousJob& job) {
  const RankOptions& opt = s.opt;
  job.set_stream(opt.stream && s.pipe.is_first());  // every replica's scheduler
  const int runs = opt.benchmark ? opt.warmup + opt.repeat : 1;
  if (!opt.trace.empty()) barrier(s.world, opt.timeout_s, "the trace's start");
  std::unique_ptr<ResultWriter> own;  // a benchmark's runs: each its own, none journaled
  ResultWriter* writer = s.results;
  RunResult last;
  double timed_s = 0;
  for (int k = 0; k < runs; ++k) {
    if (s.world.is_first() && opt.benchmark) {
      own = make_result_writer(s, false);
      writer = own.get();
    }
    last = run_queue(s, job, writer);
    if (k >= runs - (opt.benchmark ? opt.repeat : 1)) timed_s += last.wall_s / (opt.benchmark ? opt.repeat : 1);
  }
  const std::vector<FloorStage> floor = opt.benchmark ? floor_stages(s, job, s.pipeline->executor()) : std::vector<FloorStage>();
  const std::vector<std::string> lines = run_lines(s, last, job.shape(), writer, timed_s, floor);
  for (const auto& l : lines) log_info(l);
  if (!opt.trace.empty()) {
    nlohmann::json meta = trace_meta(s, "generation", last.sched.items);
    meta["new_tokens"] = s.max_new_tokens;
    meta["scheduler"] = "continuous";
    deliver_job_trace(s, meta);
  }
  fault_point(s.world.rank, "output");
  JobOutcome out;
  if (!s.world.is_first()) return out;
  if (!opt.metrics.empty()) {
    RunMetrics m = run_metrics(writer->finished(), last.sched, job.shape().state.n_slots, last.wall_s);
    m.floor_s = memory_floor_s(floor, last.sched);  // 0 unless --benchmark on GPUs (as the log line)
    write_metrics(opt.metrics, m);
  }
  out = generation_outcome(s, writer->result());
  if (!opt.output.empty() && out.code == kExitOk && !opt.benchmark) writer->remove_partial();
  for (const auto& l : out.lines) log_info(l);
  out.lines.clear();
  if (!opt.benchmark)
    out.done = cat("done: ", s.n_seq, " sequences (", writer->n_done() - writer->n_resumed(), " run now), ",
                   writer->new_tokens(), " new tokens in ", fixed(last.wall_s, 3), " s (",
                   fixed(double(writer->new_tokens()) / last.wall_s, 1), " tokens/s)");
  return out;
}

}  // namespace lfm2
