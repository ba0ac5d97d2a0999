// Generation with continuous batching (continuous_job.h) over the whole job: each replica's first
// stage streams its block's prompts through the scheduler; the finished sequences go to the
// replica's last stage and from there, as every job's results do, to the job's last rank, which
// validates and writes them (generation.cpp's outcome).
#include <algorithm>
#include <chrono>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "rank/jobs/job_setup.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/report/run_report.h"
#include "rank/report/trace_file.h"

namespace lfm2 {
namespace {

constexpr int kResultTag = 2;  // on the pipeline's host link (plan_link.h uses 1)

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A replica's block of prompts in input order, with each sequence's own parameters.
class BlockSource final : public PromptSource {
 public:
  explicit BlockSource(const RankSetup& s) : s_(s) {}
  bool next(SeqRequest* r, std::vector<int32_t>* ids) override {
    const TokenInputs& in = s_.inputs;
    if (i_ >= in.n_seq) return false;
    const SeqSettings& st = s_.settings[size_t(i_)];
    r->seq = s_.mine().seqs.begin + i_;
    r->prompt_len = in.length(i_);
    r->max_new_tokens = st.max_new_tokens;
    r->sampling = {st.temperature, st.top_k, st.top_p, st.seed};
    ids->assign(in.ids.begin() + i_ * in.seq_len, in.ids.begin() + i_ * in.seq_len + r->prompt_len);
    ++i_;
    return true;
  }

 private:
  const RankSetup& s_;
  int64_t i_ = 0;
};

// The block's finished sequences as the outputs hold them: (N, K) tokens, after a sequence's last
// its EOS repeated (as the static schedule's slots repeat it), or -1 where it stopped at its own
// max_new_tokens below K.
GenerateResult block_result(const std::map<int64_t, FinishedSeq>& done, int64_t begin, int64_t n, int64_t K) {
  GenerateResult r;
  r.n_new = K;
  r.generated.assign(size_t(n * K), -1);
  r.n_generated.assign(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto it = done.find(begin + i);
    LFM2_CHECK(it != done.end(), "generation: sequence ", begin + i, " never finished");
    const FinishedSeq& f = it->second;
    const int64_t m = int64_t(f.tokens.size());
    for (int64_t t = 0; t < K; ++t)
      r.generated[size_t(i * K + t)] = t < m ? f.tokens[size_t(t)] : f.ended_at_eos ? f.tokens.back() : -1;
    r.n_generated[size_t(i)] = int32_t(m);
  }
  return r;
}

// The first stage's results to the replica's last stage (which takes part in the gather).
GenerateResult to_last_stage(const RankSetup& s, GenerateResult mine) {
  const WorldConfig& pipe = s.pipe;
  if (pipe.size == 1 || !(pipe.is_first() || pipe.is_last())) return mine;
  const int64_t n = s.mine().seqs.size(), K = s.max_new_tokens;
  if (pipe.is_last()) {
    mine.n_new = K;
    mine.generated.resize(size_t(n * K));
    mine.n_generated.resize(size_t(n));
  }
  MPI_Request reqs[2];
  const int peer = pipe.is_first() ? pipe.size - 1 : 0;
  void* bufs[2] = {mine.generated.data(), mine.n_generated.data()};
  const int counts[2] = {int(n * K), int(n)};
  for (int k = 0; k < 2; ++k) {
    if (pipe.is_first())
      MPI_CHECK(MPI_Isend(bufs[k], counts[k], MPI_INT32_T, peer, kResultTag, pipe.link, &reqs[k]), "sending results");
    else
      MPI_CHECK(MPI_Irecv(bufs[k], counts[k], MPI_INT32_T, peer, kResultTag, pipe.link, &reqs[k]), "receiving results");
  }
  for (MPI_Request& r : reqs) wait_mpi_request(&r, s.opt.timeout_s, "the results of the first stage");
  return mine;
}

struct RunStats {
  std::map<int64_t, FinishedSeq> done;
  SchedulerStats sched;
  double wall_s = 0;
  StageTiming timing;
};

// One run of the whole block, between two barriers (rank 0's wall time covers every rank's work).
RunStats run_block(RankSetup& s, ContinuousJob& job) {
  RunStats r;
  BlockSource source(s);
  job.prepare(s.pipe.is_first() ? &source : nullptr,
              [&](FinishedSeq&& f) { r.done.emplace(f.seq, std::move(f)); });
  barrier(s.world, s.opt.timeout_s, "a barrier between generation runs");
  const double t0 = now_s();
  r.timing = s.pipeline->run(job.feed(), job.memory());
  barrier(s.world, s.opt.timeout_s, "a barrier between generation runs");
  r.wall_s = now_s() - t0;
  if (job.scheduler_feed()) r.sched = job.scheduler_feed()->scheduler().stats();
  return r;
}

// "continuous: 41 items (...)": what the scheduler did, on rank 0 (its replica's).
std::string scheduler_line(const SchedulerStats& st, const ContinuousShape& shape) {
  const double occupancy = st.items ? double(st.slot_items) / double(st.items * shape.state.n_slots) : 0;
  return cat("continuous: ", st.items, " steps: ", st.decode_rows, " decode rows, ", st.prompt_rows,
             " prompt rows, ", st.forced_rows, " recomputed decode rows; ", st.preemptions, " preemptions; ",
             "slot occupancy ", fixed(100 * occupancy, 1), "% of ", shape.state.n_slots, " slots; pool ",
             shape.state.n_pages, " pages of ", shape.state.page_size);
}

}  // namespace

JobOutcome run_continuous(RankSetup& s, ContinuousJob& job) {
  const RankOptions& opt = s.opt;
  job.set_stream(opt.stream && s.pipe.is_last() && s.pipe.replica == 0);
  const int runs = opt.benchmark ? opt.warmup + opt.repeat : 1;
  if (!opt.trace.empty()) barrier(s.world, opt.timeout_s, "the trace's start");
  RunStats last;
  double timed_s = 0;
  for (int k = 0; k < runs; ++k) {
    last = run_block(s, job);
    if (k >= runs - (opt.benchmark ? opt.repeat : 1)) timed_s += last.wall_s;
  }
  const int64_t N = s.n_seq;
  int64_t generated = 0;
  for (const auto& kv : last.done) generated += int64_t(kv.second.tokens.size());
  const auto timing = gather_timing(s.world, s.layout, last.timing, opt.timeout_s);
  std::vector<std::string> lines;
  if (s.world.is_first()) {
    lines = replica_pipeline_report(timing, s.layout, s.work, s.stages, 1);
    lines.push_back(scheduler_line(last.sched, job.shape()));
    if (opt.benchmark) {
      const double wall = timed_s / opt.repeat;
      lines.push_back(cat("benchmark: continuous generation of ", s.mine().seqs.size(), " sequences (", generated,
                          " new tokens on replica 0): ", fixed(wall, 4), " s, ", fixed(double(generated) / wall, 1),
                          " tokens/s"));
    }
    for (const auto& l : lines) log_info(l);
  }
  if (!opt.trace.empty()) {
    nlohmann::json meta = trace_meta(s, "generation", last.sched.items);
    meta["new_tokens"] = s.max_new_tokens;
    meta["scheduler"] = "continuous";
    deliver_job_trace(s, meta);
  }
  fault_point(s.world.rank, "output");
  GenerateResult mine;
  if (s.pipe.is_first()) mine = block_result(last.done, s.mine().seqs.begin, s.mine().seqs.size(), s.max_new_tokens);
  mine = to_last_stage(s, std::move(mine));
  const GenerateResult all = gather_generated(s, s.pipe.is_last() ? mine : GenerateResult{}, s.max_new_tokens);
  JobOutcome out = s.world.is_last() ? generation_outcome(s, all) : JobOutcome{};
  if (!opt.benchmark)
    out.done = cat("done: ", N, " sequences, up to ", s.max_new_tokens, " new tokens each, in ", fixed(last.wall_s, 3),
                   " s (replica 0: ", generated, " tokens, ", fixed(double(generated) / last.wall_s, 1), " tokens/s)");
  return out;
}

}  // namespace lfm2
