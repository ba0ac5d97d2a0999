#include "rank/jobs/job_setup.h"

#include <algorithm>

#include "common/log.h"
#include "rank/mpi/fatal.h"
#include "rank/report/run_report.h"
#include "rank/report/trace_file.h"

namespace lfm2 {

std::vector<SeqBlock> RankSetup::blocks() const {
  std::vector<SeqBlock> b;
  for (const ReplicaWork& w : work) b.push_back(w.seqs);
  return b;
}

TokenOutputs job_outputs(const RankSetup& s) {
  TokenOutputs o;
  o.n_seq = s.n_seq;
  o.seq_len = s.seq_len;
  o.vocab = s.cfg.vocab_size;
  return o;
}

void write_job_outputs(const std::string& path, const TokenOutputs& o, const nlohmann::json& meta, JobOutcome& out) {
  try {
    write_outputs(path, o, meta);
    out.lines.push_back("wrote " + path);
  } catch (const std::exception& e) {
    log_error(e.what());
    out.code = std::max(out.code, kExitError);
  }
}

std::vector<std::string> run_once(RankSetup& s, const std::vector<StepPlan>& schedule, const StepMemory& memory,
                                  int64_t steps) {
  if (!s.opt.trace.empty()) barrier(s.world, s.opt.timeout_s, "the trace's start");
  const StageTiming t = s.pipeline->run(schedule, memory);
  const auto timing = gather_timing(s.world, s.layout, t, s.opt.timeout_s);
  if (!s.world.is_first()) return {};
  return replica_pipeline_report(timing, s.layout, s.work, s.stages, steps);
}

nlohmann::json trace_meta(const RankSetup& s, const char* job, int64_t n_micro) {
  return {{"job", job},          {"microbatch", s.microbatch}, {"microbatches", n_micro},
          {"sequences", s.n_seq}, {"seq_len", s.seq_len},      {"dtype", s.opt.dtype}};
}

int deliver_job_trace(const RankSetup& s, const nlohmann::json& meta) {
  return deliver_trace(s.world, *s.pipeline, s.stages, s.opt.trace, meta, s.opt.timeout_s);
}

nlohmann::json run_metadata(const RankSetup& s) {
  int64_t n_micro = 0;
  std::string per_replica;
  for (const ReplicaWork& w : s.work) {
    n_micro += w.n_micro();
    per_replica += (per_replica.empty() ? "" : ",") + std::to_string(w.seqs.size());
  }
  return {{"format", "lfm2-rank-outputs"},
          {"model", s.opt.model},
          {"inputs", s.opt.inputs},
          {"n_ranks", s.world.size},
          {"replicas", s.layout.n_replicas},
          {"stages", s.layout.n_stages},
          {"replica_sequences", per_replica},
          {"microbatch", s.microbatch},
          {"n_microbatches", n_micro},
          {"layers", layer_counts(s.stages)},
          {"dtype", dtype_name(s.dtype)},
          {"tf32", s.use_cuda && s.opt.tf32},
          {"device", s.use_cuda ? "cuda" : "cpu"},
          {"created", utc_now()}};
}

}  // namespace lfm2
