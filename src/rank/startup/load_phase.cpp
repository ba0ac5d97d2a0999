// Phase B and B' (phases.h): the layers of each stage, one GPU per rank, this rank's stage, its
// transport and the job's buffers, all allocated before the ready agreement; then, with NCCL, the
// communicators.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "io/token_files.h"
#include "io/weight_names.h"
#include "model/checked_stage.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/report/run_report.h"
#include "rank/report/startup_line.h"
#include "rank/startup/checks.h"
#include "rank/startup/phases.h"

namespace lfm2 {
namespace {

// One GPU per rank: every rank takes part in the gather, whatever its own state, so that none is
// left waiting; two ranks on one GPU fail with one line instead of sharing its memory.
bool gather_gpus(Startup& s, bool ok) {
  const WorldConfig& world = s.job.world;
  GpuFacts mine;
  if (ok) ok = startup_step([&] { mine = this_gpu(world); });
  const bool gathered = startup_step([&] { s.gpus = allgather_gpus(world, mine, s.job.opt.timeout_s); });
  ok = ok && gathered;
  if (ok) ok = startup_step([&] { check_distinct_gpus(s.gpus); }, world.is_first());
  return ok;
}

// The test hook LFM2_TEST_KILL="rank:microbatch[:stop]": that rank raises SIGKILL (or SIGSTOP, to
// stall without dying) after that microbatch. Used by tests/rank to prove no rank waits forever.
void install_kill_hook(Pipeline& pipeline, int rank) {
  const char* env = std::getenv("LFM2_TEST_KILL");
  int r = -1;
  long long m = -1;
  char how[8] = "";
  if (!env || std::sscanf(env, "%d:%lld:%7s", &r, &m, how) < 2 || r != rank) return;
  pipeline.set_kill_after(m, std::string(how) == "stop" ? SIGSTOP : SIGKILL);
}

SamplingParams sampling_params(const RankOptions& opt, int64_t first_sequence) {
  SamplingParams p;
  p.first_sequence = first_sequence;
  p.temperature = float(opt.temperature);
  p.top_k = opt.top_k;
  p.top_p = float(opt.top_p);
  p.seed = opt.seed;
  for (int64_t e : opt.eos) p.eos.push_back(int32_t(e));
  return p;
}

// What the plan prints of this stage before it loads: its layers, their bytes, free host memory.
void note_stage(Startup& s, const StageLayers& stage) {
  RankFacts& f = s.facts;
  f.started_us = process_start_us();
  f.layer_begin = stage.layer_begin;
  f.layer_end = stage.layer_end;
  for (const auto& spec : stage_tensor_specs(s.job.cfg, stage))
    f.weight_bytes += s.weights->has(spec.path) ? s.weights->storage_bytes(spec.path) : 0;
  f.free_host = free_host_bytes();
  f.local_rank = s.job.world.local_rank;
}

// Continuous batching's shape before its pool is sized: --max-seqs slots (at most the block's
// sequences), --max-batched-tokens rows a step, pages of --page-size positions (by default 16, 64
// or 256 as the longest sequence grows), as many as the longest sequence needs in its block table.
ContinuousShape continuous_shape(const RankSetup& j, int64_t n_seq) {
  const RankOptions& opt = j.opt;
  ContinuousShape c;
  c.hidden = j.cfg.hidden_size;
  c.max_batched_tokens = opt.max_batched_tokens > 0 ? opt.max_batched_tokens : 8192;
  c.admit_wave = opt.admit_wave;
  c.prefill_first = opt.prefill_first;
  c.per_sequence_sampling = j.per_sequence_sampling;
  c.state.n_slots = std::min(opt.max_seqs, n_seq);
  c.state.page_size = opt.page_size > 0 ? opt.page_size : j.longest >= 4096 ? 256 : j.longest >= 256 ? 64 : 16;
  c.state.max_pages = (j.longest + c.state.page_size - 1) / c.state.page_size;
  return c;
}

// The job of this replica's block on this stage: the NaN checks around the executor (each
// microbatch's hidden states and logits as they are made), the pipeline's buffers, the job's memory.
void make_job(Startup& s, const StageLayers& stage) {
  const RankSetup& j = s.job;
  const RankOptions& opt = j.opt;
  const ReplicaWork& w = j.mine();
  const int64_t H = j.cfg.hidden_size;
  const CheckShape check{w.n_micro(), w.microbatch, H, j.cfg.vocab_size, w.seqs.begin};
  s.checked = make_checked_stage(*s.backend.exec, stage, check, s.n_threads, opt.allow_nonfinite);
  Transport& transport = *s.backend.transport;
  const std::vector<int32_t> lengths =
      s.lengths.empty() ? std::vector<int32_t>()
                        : std::vector<int32_t>(s.lengths.begin() + w.seqs.begin, s.lengths.begin() + w.seqs.end);
  if (j.continuous) {
    s.continuous_shape = continuous_shape(j, w.seqs.size());
    s.pipeline = std::make_unique<Pipeline>(j.pipe, *s.checked, transport, H, s.continuous_shape.max_item_tokens());
  } else if (opt.max_new_tokens > 0) {
    // Prefill in chunks of at most 16384 rows unless told (the scoring microbatch's cap): a group's
    // prompts need not fit one step's buffers.
    constexpr int64_t kDefaultChunk = 16384;
    const int64_t chunk = opt.prefill_chunk > 0                                    ? opt.prefill_chunk
                          : std::min(w.microbatch, w.seqs.size()) * w.width > kDefaultChunk ? kDefaultChunk
                                                                                            : 0;
    const GenerateShape shape{w.seqs.size(), w.width, w.microbatch, H, opt.max_new_tokens, lengths, chunk};
    check_state_fits(*s.checked, shape, j.use_cuda);
    s.pipeline = std::make_unique<Pipeline>(j.pipe, *s.checked, transport, H, shape.max_item_tokens());
    s.generate = std::make_unique<GenerateJob>(j.pipe, *s.checked, shape, sampling_params(opt, w.seqs.begin));
  } else {
    // The logits cross to the host only for someone who reads them: the output file, or answers
    // to compare (not in a benchmark, which validates the top-1 only). Every replica's last
    // stage must know, and only the job's last rank reads the answers: any answers count.
    const bool want_logits = !opt.benchmark && (!opt.output.empty() || !opt.answers.empty());
    const PipelineShape shape{w.seqs.size(), w.width, w.microbatch, H, j.cfg.vocab_size, want_logits,
                              opt.all_logits, lengths};
    s.pipeline = std::make_unique<Pipeline>(j.pipe, *s.checked, transport, H, shape.max_micro_tokens());
    s.score = std::make_unique<ScoreJob>(j.pipe, *s.checked, shape);
  }
  s.pipeline->set_tracing(!opt.trace.empty());
  if (s.backend.timer) s.pipeline->set_busy_timer(s.backend.timer.get());
  install_kill_hook(*s.pipeline, j.world.rank);
}

// The pages this rank's pool could hold: --kv-pages; on the CPU enough for every slot at the
// longest sequence; on a GPU what --gpu-memory leaves after the weights and buffers (less a
// margin for the state's workspaces), at most that many and fewer than 2^31 positions (a small
// model on a large GPU; --kv-pages past that is refused when the state is allocated).
int64_t pool_capacity(Startup& s) {
  const RankOptions& opt = s.job.opt;
  const StateShape& st = s.continuous_shape.state;
  const int64_t enough = st.n_slots * st.max_pages;
  if (opt.kv_pages > 0) return opt.kv_pages;
  if (!s.job.use_cuda) return enough;
  const GpuMemory g = gpu_memory(s.backend);
  const int64_t budget = g.free_bytes - int64_t((1 - opt.gpu_memory) * double(g.total_bytes));
  const int64_t margin = std::max<int64_t>(int64_t(256) << 20, budget / 20);
  const int64_t room = budget - margin - st.n_slots * (s.checked->slot_bytes() + st.max_pages * 4);
  const int64_t page = s.checked->page_bytes(st.page_size);
  return std::min({enough, st.max_pool_pages(), std::max<int64_t>(0, room / std::max<int64_t>(page, 1))});
}

// This rank's stage, transport and job; the last rank's answers.
// What an FP8 file holds, for the load line: "; fp8 e4m3 experts, scales per output channel".
std::string fp8_note(const Fp8Weights& f) {
  if (!f.on) return "";
  return cat("; fp8 e4m3 ", f.projections ? "experts and projections" : "experts", ", scales per ",
             f.scheme == Fp8Scheme::Channel ? "output channel" : "128 x 128 block");
}

void load(Startup& s) {
  RankSetup& j = s.job;
  const RankOptions& opt = j.opt;
  fault_point(j.world.rank, "loading");
  const StageLayers& stage = j.stages[size_t(j.pipe.rank)];
  if (s.weights->is_stage_file())
    check_stage_file(s.weights->stage(), s.weight_path, stage, j.world, j.pipe, j.layout.n_replicas, opt);
  note_stage(s, stage);
  s.backend = make_backend(opt, j.pipe, stage, *s.weights, j.use_cuda, j.dtype, s.n_threads);
  s.facts.bytes_read = s.weights->bytes_read();
  s.facts.load_us = s.backend.load_us;
  log_info(cat("read ", mib(s.facts.bytes_read), " of weights (layers ", stage.layer_begin, "-", stage.layer_end - 1,
               fp8_note(j.cfg.fp8), ") from ", s.weight_path, " in ", s.backend.load_us / 1000, " ms",
               opt.verify_weights ? "" : " (digests not checked: --verify-weights off)"));
  // The rank that writes the output reads the answers: the job's last (continuous: its first).
  if ((j.continuous ? j.world.is_first() : j.world.is_last()) && !opt.answers.empty()) {
    j.answers = read_answers(opt.answers);
    check_answers(j.answers, j.n_seq, j.cfg.vocab_size, opt.answers);
    // Generated tokens are compared position by position: another width would validate a prefix.
    LFM2_CHECK(opt.max_new_tokens <= 0 || j.answers.generated.empty() || j.answers.n_new == opt.max_new_tokens,
               opt.answers, ": its generated tokens are ", j.answers.n_new, " per sequence, this run makes ",
               opt.max_new_tokens, " (--max-new-tokens)");
  }
  make_job(s, stage);
  const GpuMemory g = gpu_memory(s.backend);  // free memory after every allocation
  s.facts.gpu = g.device;
  s.facts.gpu_weight_bytes = g.weight_bytes;
  s.facts.gpu_free = g.free_bytes;
  s.facts.gpu_total = g.total_bytes;
  if (j.continuous) s.pool_pages = pool_capacity(s);
  j.stage_weight_bytes = s.backend.exec->weight_bytes();
  if (opt.benchmark && j.use_cuda) j.copy_bandwidth = device_copy_bandwidth(s.backend);
}

// Continuous batching: every stage's pool holds the pages the smallest can (all stages and
// replicas alike), at least the longest sequence's; then each allocates its state.
bool size_pool(Startup& s) {
  RankSetup& j = s.job;
  const RankOptions& opt = j.opt;
  const auto agreed = allreduce_max(j.world, {-s.pool_pages}, opt.timeout_s, "the pool of KV pages");
  ContinuousShape& c = s.continuous_shape;
  c.state.n_pages = -agreed[0];
  bool ok = startup_step(
      [&] {
        LFM2_CHECK(c.state.n_pages >= c.state.max_pages, "the pool of KV pages holds ", c.state.n_pages, " pages of ",
                   c.state.page_size, " positions (", c.state.n_pages * c.state.page_size,
                   "), the longest sequence needs ", j.longest, " (a prompt longer than the pool can ever hold; "
                   "more --gpu-memory or --kv-pages, or more stages)");
      },
      j.world.is_first());
  if (ok)
    ok = startup_step([&] {
      s.continuous = std::make_unique<ContinuousJob>(j.pipe, *s.checked, c, sampling_params(opt, 0), opt.timeout_s);
    });
  // The journal of --output (or the one --resume goes on from, if it is this job's).
  if (ok && j.world.is_first() && !opt.benchmark)
    ok = startup_step([&] {
      s.results = make_result_writer(j, !opt.output.empty());
      j.results = s.results.get();
    });
  return all_ready(j.world, ok, opt.timeout_s, "the state agreement");
}

}  // namespace

bool load_stage(Startup& s) {
  RankSetup& j = s.job;
  const RankOptions& opt = j.opt;
  bool ok = startup_step(
      [&] {
        j.stages = plan_stages(opt, j.cfg, s.weights->is_stage_file(), j.pipe.size, j.seq_len, j.use_cuda);
        if (!j.use_cuda) check_cpu_fallback(opt);
        check_generation(opt, j.cfg, j.seq_len);
      },
      j.world.is_first());
  s.n_threads = opt.threads > 0 ? opt.threads : default_threads(j.world);
  if (j.use_cuda) ok = gather_gpus(s, ok);
  if (ok) ok = startup_step([&] { load(s); });
  fault_point(j.world.rank, "agreement");
  if (!all_ready(j.world, ok, opt.timeout_s, "the ready agreement")) return false;
  return !j.continuous || size_pool(s);
}

bool connect_stages(Startup& s) {
  if (!s.backend.connect) return true;
  const RankSetup& j = s.job;
  const double t0 = now_s();
  const bool ok = startup_step(s.backend.connect);
  if (!all_ready(j.world, ok, j.opt.timeout_s, "the NCCL agreement")) return false;
  const int P = j.pipe.size, R = j.layout.n_replicas;
  if (j.world.is_first())
    log_info(cat("nccl: communicators of ", P, " ranks", R > 1 ? cat(" in each of ", R, " replicas") : std::string(),
                 " and warm-up exchange in ", int64_t((now_s() - t0) * 1000), " ms"));
  return true;
}

}  // namespace lfm2
