// One lfm2-rank process from start-up to exit code: the start-up phases (startup/phases.h), each
// agreed by every rank, then the exchange, where any error ends the whole job.
#include "common/error.h"
#include "common/log.h"
#include "rank/jobs/job_setup.h"
#include "rank/mpi/fatal.h"
#include "rank/options.h"
#include "rank/report/run_report.h"
#include "rank/report/startup_line.h"
#include "rank/startup/phases.h"
#include "rank/startup/plan_lines.h"

namespace lfm2 {
namespace {

// Phase C: the plan, the job, its report, the start-up line and the exit agreement.
int exchange(Startup& s) {
  RankSetup& j = s.job;
  const WorldConfig& world = j.world;
  const RankOptions& opt = j.opt;
  try {
    const auto all = gather_facts(world, s.facts, opt.timeout_s);
    j.pipeline = s.pipeline.get();
    if (world.is_first())
      print_plan(j, plan_text(opt, s.weights->is_stage_file(), j.use_cuda, s.n_threads, s.backend.transport->name()),
                 all, s.gpus, s.replicas.hosts());
    if (world.is_first() && opt.max_new_tokens > 0) log_info(generation_line(opt));
    std::vector<StartupFacts> startup;
    for (const RankFacts& f : all) startup.push_back({f.started_us, f.load_us, f.bytes_read});
    const int64_t first_micro_us = wall_now_us();  // rank 0's first microbatch enters the pipeline next
    const JobOutcome out = s.score        ? run_scoring(j, *s.score)
                           : s.continuous ? run_continuous(j, *s.continuous)
                                          : run_generation(j, *s.generate);
    deliver_report(world, out.lines, opt.timeout_s);
    if (world.is_first()) log_info(startup_line(world, startup, first_micro_us));
    const int code =
        int(allreduce_max(world, {out.code}, unnamed_wait_s(world, opt.timeout_s), "the exit agreement")[0]);
    if (world.is_first() && !out.done.empty()) log_info(cat(out.done, ", exit ", code));
    return code;
  } catch (const std::exception& e) {
    abort_job(world, e);
  }
}

}  // namespace

int run_rank(const Replicas& replicas, RankOptions opt) {
  Startup s(replicas, std::move(opt));
  if (!open_files(s) || !split_work(s) || !load_stage(s) || !connect_stages(s)) return kExitError;
  return exchange(s);
}

}  // namespace lfm2
