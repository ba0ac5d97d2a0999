// One lfm2-rank process from start-up to exit code.
//
// Start-up runs in agreed phases so that a rank's failure stops every rank before any hidden state
// moves: (A) open this rank's weight file, rank 0 reads the inputs' shape (and prompt lengths); all
// agree and learn (N, S). The sequences are split into one block per replica (replicas.h) and each
// replica's first stage reads and checks its own block; all agree. (B) the plan, the stage-file
// check, loading the stage, the last rank's answers, the buffers; all agree again. On CUDA, (B')
// each replica's NCCL communicators and their warm-up exchange, agreed once more. Then (C) the
// exchange, where any error aborts the job. Every agreement is over the whole job (one replica's
// error stops all of them); the pipeline, its transport and its job are the replica's.
//
// The GPU: node-local rank r takes device r of those it sees (a rank beyond the count is an error),
// and every rank gathers every rank's GPU uuid before loading, so that two ranks on one GPU fail
// with one line instead of sharing its memory.
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "io/token_files.h"
#include "io/weight_file.h"
#include "model/checked_stage.h"
#include "model/stage_executor.h"
#include "plan/layer_partition.h"
#include "rank/engine/pipeline.h"
#include "rank/engine/schedule_chart.h"
#include "rank/jobs/job_setup.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/mpi/poll.h"
#include "rank/mpi/replica_comms.h"
#include "rank/options.h"
#include "rank/report/replica_lines.h"
#include "rank/report/run_report.h"
#include "rank/report/startup_line.h"
#include "rank/startup/gpu_identity.h"
#include "rank/startup/output_paths.h"
#include "rank/startup/same_model.h"
#include "rank/transport/transport.h"
#ifdef LFM2_HAVE_CUDA
#include "rank/engine/cuda_busy_timer.h"
#include "rank/startup/gpu_info.h"
#include "rank/transport/nccl_transport.h"
#endif

namespace lfm2 {
namespace {

namespace fs = std::filesystem;


double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1 << 20));
  return buf;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / (1 << 30));
  return buf;
}

// Where the shipped default lives: ./data/default, else the source tree's.
std::string default_dir() {
  if (fs::exists("data/default/recipe.json")) return "data/default";
  return std::string(LFM2_SOURCE_DIR) + "/data/default";
}

// Fills in the default's paths and, when its model is missing, fails with how to create it.
void resolve_default(RankOptions& opt) {
  const std::string dir = default_dir();
  const std::string recipe_path = dir + "/recipe.json";
  std::ifstream in(recipe_path);
  LFM2_CHECK(in.good(), recipe_path, ": the shipped default's recipe is missing; give --model and --inputs");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    LFM2_FAIL(recipe_path, ": ", e.what());
  }
  opt.model = dir + "/" + r.at("model").get<std::string>();
  opt.inputs = dir + "/" + r.at("inputs").get<std::string>();
  if (opt.answers.empty()) opt.answers = dir + "/" + r.at("answers").get<std::string>();
  LFM2_CHECK(fs::exists(opt.model), opt.model, " is missing: create it with `h5pack synth ", opt.model, " --preset ",
             r.at("preset").get<std::string>(), " --seed ", r.at("seed").get<int64_t>(), " --dtype ",
             r.at("dtype").get<std::string>(), "` (build/src/h5pack/h5pack)");
}

void check_backend(const RankOptions& opt) {
#ifndef LFM2_HAVE_CUDA
  LFM2_CHECK(opt.device != "cuda", "--device cuda: this build has no CUDA backend (configure with nvcc present)");
  LFM2_CHECK(opt.dtype == "fp32", "--dtype ", opt.dtype, ": the CPU backend computes in fp32 only (", opt.dtype,
             " comes with the CUDA backend)");
  LFM2_CHECK(!opt.tf32, "--tf32: the CPU backend computes in exact fp32 (TF32 comes with the CUDA backend)");
#else
  LFM2_CHECK(opt.device != "cpu" || opt.dtype == "fp32", "--dtype ", opt.dtype,
             ": the CPU backend computes in fp32 only (use --device cuda)");
  LFM2_CHECK(opt.device != "cpu" || !opt.tf32, "--tf32: the CPU backend computes in exact fp32 (use --device cuda)");
#endif
  LFM2_CHECK(!opt.tf32 || opt.dtype == "fp32", "--tf32 applies to --dtype fp32 only, not ", opt.dtype);
}

// When --device auto found no GPU on some rank, the run falls back to the CPU, which has no bf16.
void check_cpu_fallback(const RankOptions& opt) {
  LFM2_CHECK(opt.dtype == "fp32", "--dtype ", opt.dtype,
             ": the CPU backend computes in fp32 only (--device auto found no GPU on every rank)");
  LFM2_CHECK(!opt.tf32, "--tf32: the CPU backend computes in exact fp32 (--device auto found no GPU on every rank)");
}

// "stage-%d.h5" -> "stage-2.h5" for rank 2; any other path is the whole-model file.
std::string weight_path_for(const std::string& model, int rank) {
  const size_t pos = model.find("%d");
  if (pos == std::string::npos) return model;
  LFM2_CHECK(model.find("%d", pos + 2) == std::string::npos, "--model '", model, "' has more than one %d");
  return model.substr(0, pos) + std::to_string(rank) + model.substr(pos + 2);
}

int64_t free_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

// Threads per rank: the cores this rank is bound to, or, when the launcher did not bind it, the
// node's cores shared among the node's ranks.
int default_threads(const WorldConfig& world) {
  const int node_cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int shared = std::max(1, node_cores / std::max(1, world.local_size));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return shared;
  const int mine = CPU_COUNT(&set);
  return mine < node_cores ? std::max(1, mine) : shared;
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

// Per-rank facts gathered to rank 0 for the plan.
struct RankFacts {
  int64_t layer_begin, layer_end, weight_bytes, bytes_read, free_host, local_rank;
  int64_t gpu, gpu_weight_bytes, gpu_free, gpu_total;  // gpu -1: the CPU backend
  int64_t started_us, load_us;                         // start-up (startup_report.h)
};

template <size_t N>
void copy_text(char (&dst)[N], const std::string& src) {
  std::snprintf(dst, N, "%s", src.c_str());
}

std::vector<RankFacts> gather_facts(const WorldConfig& world, const RankFacts& mine, double timeout_s) {
  std::vector<RankFacts> all(size_t(world.size));
  constexpr int kN = sizeof(RankFacts) / sizeof(int64_t);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&mine, kN, MPI_INT64_T, all.data(), kN, MPI_INT64_T, 0, world.comm, &req),
            "gathering the plan");
  wait_mpi_request(&req, timeout_s, "gathering the plan");
  return all;
}

// Rank 0's n ints to every rank.
std::vector<int32_t> broadcast_ints(const WorldConfig& world, std::vector<int32_t> v, int64_t n, double timeout_s) {
  v.resize(size_t(n));
  LFM2_CHECK(n <= INT32_MAX, "broadcasting ", n, " values");
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(v.data(), int(n), MPI_INT32_T, 0, world.comm, &req), "broadcasting the prompt lengths");
  wait_mpi_request(&req, timeout_s, "broadcasting the prompt lengths");
  return v;
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

// Generation's options against the model (every rank checks; rank 0 reports).
void check_generation(const RankOptions& opt, const ModelConfig& cfg, int64_t seq_len) {
  if (opt.max_new_tokens <= 0) return;
  LFM2_CHECK(!opt.all_logits, "--all-logits scores prompts; it does not go with --max-new-tokens");
  LFM2_CHECK(seq_len + opt.max_new_tokens - 1 <= cfg.max_position_embeddings, "--max-new-tokens ",
             opt.max_new_tokens, " after prompts of up to ", seq_len, " tokens needs ", seq_len + opt.max_new_tokens - 1,
             " positions, past the model's max_position_embeddings ", cfg.max_position_embeddings);
  for (int64_t e : opt.eos)
    LFM2_CHECK(e >= 0 && e < cfg.vocab_size, "--eos ", e, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
}

// The generation state of this stage must fit in the memory it lives in, checked before any work.
void check_state_fits(const StageExecutor& exec, const GenerateShape& shape, bool on_gpu) {
  const int64_t need = exec.state_bytes(shape.n_seq, shape.max_len());
  if (on_gpu) return;  // the CUDA executor names the bytes itself when its allocation fails
  const int64_t free = free_host_bytes();
  LFM2_CHECK(free < 0 || need <= free, "the generation state (KV cache and conv state) of ", shape.n_seq,
             " sequences x ", shape.max_len(), " positions needs ", need >> 20, " MiB on this rank, ", free >> 20,
             " MiB of host memory are free (fewer sequences, shorter prompts or fewer new tokens)");
}

// This replica's block of the inputs, read by its first stage: only its rows, only up to its
// longest prompt (an HDF5 hyperslab), checked, padding zeroed.
TokenInputs read_block(const std::string& path, const ReplicaWork& w, const ModelConfig& cfg) {
  TokenInputs in = read_inputs_block(path, w.seqs.begin, w.seqs.end, w.width);
  check_inputs(in, cfg.vocab_size, cfg.max_position_embeddings, path, w.seqs.begin);
  zero_padding(in);
  return in;
}

std::vector<int32_t> lengths_of(const std::vector<int32_t>& lengths, const SeqBlock& b) {
  if (lengths.empty()) return {};
  return std::vector<int32_t>(lengths.begin() + b.begin, lengths.begin() + b.end);
}

// What the plan says beside the layers: how they were split, the backend, the transport.
struct PlanText {
  std::string how, backend, transport;
};

PlanText plan_text(const RankOptions& opt, bool stage_files, bool use_cuda, int n_threads, const char* transport) {
  PlanText t;
  t.how = !opt.layers.empty() ? "--layers " + opt.layers
          : stage_files      ? std::string("as the stage files were split")
          : use_cuda         ? std::string("balanced by the GPU cost model")
                             : std::string("balanced by FLOPs");
  t.backend = use_cuda ? cat("cuda ", opt.dtype, opt.dtype != "fp32" ? "" : opt.tf32 ? " (TF32)" : " (TF32 off)",
                             ", CUDA graphs ", opt.cuda_graphs ? "on" : "off")
                       : cat("cpu fp32, threads per rank ", n_threads);
  t.transport = transport;
  return t;
}

// The layers of each of P stages: --layers, the split a stage file was cut with (h5pack split's
// default plan: seq_len 32, last-position head), or a split balanced for this run's sequence length.
std::vector<StagePlan> plan_stages(const RankOptions& opt, const ModelConfig& cfg, bool stage_files, int P, int64_t S,
                                   bool use_cuda) {
  const int L = int(cfg.num_hidden_layers);
  if (opt.pipeline > 0)
    LFM2_CHECK(P <= L, "--pipeline ", P, ": cannot run ", P, " stages: the model has ", L,
               " layers (one stage needs at least one)");
  LFM2_CHECK(P <= L, "cannot run ", P, " ranks: the model has ", L, " layers (one rank needs at least one)");
  if (!opt.layers.empty()) return make_stage_plans(parse_layer_counts(opt.layers, L, P));
  if (stage_files) return default_stage_plans(cfg, P);
  return default_stage_plans(cfg, P, S, opt.all_logits, use_cuda ? CostModel::kGpu : CostModel::kFlops);
}

// A stage file holds the stage this rank runs, with the layers this plan gives it.
void check_stage_file(const StageInfo& s, const std::string& path, const StagePlan& plan, const WorldConfig& world,
                      const WorldConfig& pipe, int n_replicas, const RankOptions& opt) {
  const int P = pipe.size;
  LFM2_CHECK(s.stage == pipe.rank && s.n_stages == P && s.layer_begin == plan.layer_begin &&
                 s.layer_end == plan.layer_end,
             path, ": stage file for stage ", s.stage, "/", s.n_stages, " layers [", s.layer_begin, ", ", s.layer_end,
             "), but ",
             n_replicas == 1 ? cat("rank ", pipe.rank, "/", P) : cat("rank ", world.rank, " (stage ", pipe.rank, "/", P, ")"),
             " runs layers [", plan.layer_begin, ", ", plan.layer_end, ")",
             opt.layers.empty() ? " (split it for this plan, or pass its split as --layers)" : " (--layers)");
}

// The plan, printed once by rank 0 from every rank's facts: the split of the layers, the replicas
// (with several) and their work, each rank's layers, memory and GPU.
void print_plan(const RankSetup& s, const PlanText& t, const std::vector<RankFacts>& all,
                const std::vector<GpuFacts>& gpus, const std::vector<std::string>& hosts) {
  const ReplicaLayout& l = s.layout;
  const int P = l.n_stages;
  const int64_t M = s.work[0].n_micro();
  if (l.n_replicas == 1)
    log_info(cat("plan: ", P, " ranks over ", s.cfg.num_hidden_layers, " layers (", t.how, "); ", s.n_seq, " x ",
                 s.seq_len, " tokens in ", M, " microbatches of ", s.microbatch, " (GPipe bubble ",
                 fixed(100 * gpipe_bubble(P, M), 1), "%); ", t.backend, ", transport ", t.transport));
  else
    log_info(cat("plan: ", P, " stages over ", s.cfg.num_hidden_layers, " layers in each of ", l.n_replicas,
                 " replicas (", t.how, "); ", s.n_seq, " x ", s.seq_len, " tokens; ", t.backend, ", transport ",
                 t.transport));
  for (const std::string& line : replica_plan_lines(l, s.work, hosts)) log_info(line);
  for (int r = 0; r < l.n_ranks(); ++r) {
    const RankFacts& f = all[size_t(r)];
    const std::string where = l.n_replicas == 1 ? cat("local ", f.local_rank)
                                                : cat("replica ", l.replica_of[size_t(r)], " stage ",
                                                      l.stage_of[size_t(r)], ", local ", f.local_rank);
    log_info(cat("plan: rank ", r, " (", where, "): layers ", f.layer_begin, "-", f.layer_end - 1, " (",
                 f.layer_end - f.layer_begin, "), weights ", mib(f.weight_bytes), ", read ", mib(f.bytes_read),
                 ", free host memory ", f.free_host < 0 ? std::string("?") : gib(f.free_host),
                 f.gpu < 0 ? std::string()
                           : cat("; GPU ", f.gpu, " ", gpus[size_t(r)].name, " (", gpus[size_t(r)].uuid_text, ") on ",
                                 gpus[size_t(r)].host, ": weights ", gib(f.gpu_weight_bytes), ", free ",
                                 gib(f.gpu_free), " of ", gib(f.gpu_total))));
  }
  for (int rep = 0; rep < l.n_replicas; ++rep) {
    const int64_t m = s.work[size_t(rep)].n_micro();
    if (m < P)
      log_info(cat("warning: ", m, " microbatches for ", P, l.n_replicas == 1 ? " ranks" : " stages",
                   l.n_replicas == 1 ? std::string() : cat(" in replica ", rep), ": some ranks will idle (bubble ",
                   int(100 * gpipe_bubble(P, m)), "%); use a smaller --microbatch"));
  }
}

}  // namespace

int run_rank(const Replicas& rep, RankOptions opt) {
  const WorldConfig& world = rep.world();  // the job: every agreement, the results, the exit code
  const WorldConfig& pipe = rep.pipe();    // this rank's pipeline: stage pipe.rank of pipe.size
  const ReplicaLayout& layout = rep.layout();
  // Rank 0 reads the inputs' shape and writes the trace; the job's last rank (the last stage of its
  // replica) reads the answers, gathers every replica's results and writes the output.
  const bool r0 = world.is_first(), last = world.is_last();
  const int P = pipe.size, R = layout.n_replicas;

  // ---- phase A: options, this rank's weight file, the inputs' shape (rank 0).
  bool ok = startup_step([&] { check_backend(opt); }, r0);
  if (ok && opt.use_default) ok = startup_step([&] { resolve_default(opt); }, r0);
  if (ok && (opt.model.empty() || opt.inputs.empty()))
    ok = startup_step([&] { LFM2_FAIL("give both --model and --inputs (or neither, for the shipped default)"); }, r0);
  // Rank 0 writes the trace, the last rank the output: each is writable and no input, or fails now.
  if (ok && (r0 || last))
    ok = startup_step(
        [&] { check_run_outputs(opt, world, P, [&](int stage) { return weight_path_for(opt.model, stage); }); });
  std::string weight_path;
  std::unique_ptr<WeightReader> weights;
  TokenInputs inputs;
  if (ok)
    ok = startup_step([&] {
      weight_path = weight_path_for(opt.model, pipe.rank);
      weights = std::make_unique<WeightReader>(weight_path);
      weights->set_verify(opt.verify_weights);
    });
  if (ok && r0)
    ok = startup_step([&] {
      inputs = read_inputs_header(opt.inputs);
      check_input_shape(inputs, weights->config().max_position_embeddings, opt.inputs);
    });
  // Every rank's file holds the same model (fingerprints), or rank 0 names two that differ.
  const bool same = startup_step([&] { check_same_model(world, weights.get(), weight_path, opt.timeout_s); });
  ok = ok && same;
  // --device auto: CUDA only when every rank sees a GPU (one transport for the whole job).
  int64_t no_gpu = 1;
#ifdef LFM2_HAVE_CUDA
  if (opt.device != "cpu") no_gpu = visible_gpu_count() > 0 ? 0 : 1;
#endif
  const auto agreed = allreduce_max(
      world, {ok ? 0 : 1, inputs.n_seq, inputs.seq_len, no_gpu, inputs.lengths.empty() ? 0 : 1}, opt.timeout_s,
      "the start-up agreement");
  if (agreed[0] != 0) return report_startup_errors(world, opt.timeout_s);
  const int64_t N = agreed[1], S = agreed[2];
  // Every rank learns the prompt lengths (the split balances them; the last stages read each
  // sequence's last position there).
  std::vector<int32_t> lengths = inputs.lengths;
  if (agreed[4] != 0 && !startup_step([&] { lengths = broadcast_ints(world, lengths, N, opt.timeout_s); }))
    return kExitError;
  const bool use_cuda = opt.device == "cuda" || (opt.device == "auto" && agreed[3] == 0);
  const DType dtype = use_cuda ? parse_dtype(opt.dtype) : DType::F32;

  // ---- the replicas' work: one block of sequences each; each replica's first stage reads its own.
  std::vector<ReplicaWork> work;
  ok = startup_step(
      [&] {
        work = plan_work(split_sequences(sequence_costs(N, S, lengths, opt.max_new_tokens), R), S, lengths,
                         opt.all_logits, opt.microbatch, P, use_cuda);
      },
      r0);
  if (ok && pipe.is_first())
    ok = startup_step([&] { inputs = read_block(opt.inputs, work[size_t(pipe.replica)], weights->config()); });
  if (!all_ready(world, ok, opt.timeout_s, "the inputs agreement")) return kExitError;
  const ReplicaWork& my_work = work[size_t(pipe.replica)];
  const int64_t microbatch = my_work.microbatch;
  const std::vector<int32_t> my_lengths = lengths_of(lengths, my_work.seqs);

  // ---- phase B: the plan, this rank's stage, the answers (last rank), the buffers.
  const ModelConfig& cfg = weights->config();
  std::vector<StagePlan> plans;
  ok = startup_step(
      [&] {
        plans = plan_stages(opt, cfg, weights->is_stage_file(), P, S, use_cuda);
        if (!use_cuda) check_cpu_fallback(opt);
        check_generation(opt, cfg, S);
      },
      r0);
  const int n_threads = opt.threads > 0 ? opt.threads : default_threads(world);
  std::unique_ptr<StageExecutor> exec, checked;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<ScoreJob> score;
  std::unique_ptr<GenerateJob> generate;
  TokenAnswers answers;
  RankFacts facts{};
  facts.started_us = process_start_us();
  facts.gpu = -1;
  std::vector<GpuFacts> gpus;
#ifdef LFM2_HAVE_CUDA
  CudaStageExecutor* cuda_exec = nullptr;
  NcclTransport* nccl = nullptr;
  std::unique_ptr<CudaBusyTimer> busy_timer;
  if (use_cuda) {
    // Every rank takes part in the gather, whatever its own state, so that none is left waiting.
    GpuFacts mine;
    if (ok)
      ok = startup_step([&] {
        const int n = visible_gpu_count();
        LFM2_CHECK(world.local_rank < n, "--device cuda: node-local rank ", world.local_rank, " on ", world.host,
                   " has no GPU of its own: ", n, " visible there for ", world.local_size,
                   " ranks (run at most one rank per GPU)");
        const GpuInfo g = gpu_info(world.local_rank);
        mine.ok = 1;
        mine.device = g.device;
        std::memcpy(mine.uuid, g.uuid, sizeof mine.uuid);
        copy_text(mine.host, world.host);
        copy_text(mine.name, g.name);
        copy_text(mine.uuid_text, g.uuid_string());
      });
    const bool gathered = startup_step([&] { gpus = allgather_gpus(world, mine, opt.timeout_s); });
    ok = ok && gathered;
    if (ok) ok = startup_step([&] { check_distinct_gpus(gpus); }, r0);
  }
#endif
  if (ok)
    ok = startup_step([&] {
      fault_point(world.rank, "loading");
      const StagePlan& plan = plans[size_t(pipe.rank)];
      if (weights->is_stage_file()) check_stage_file(weights->stage(), weight_path, plan, world, pipe, R, opt);
      facts.layer_begin = plan.layer_begin;
      facts.layer_end = plan.layer_end;
      for (const auto& spec :
           stage_tensor_specs(cfg, plan.layer_begin, plan.layer_end, plan.is_first(), plan.is_last()))
        facts.weight_bytes += weights->has(spec.path) ? weights->storage_bytes(spec.path) : 0;
      facts.free_host = free_host_bytes();
      facts.local_rank = world.local_rank;
      const double t0 = now_s();
      const StageRange range{plan.layer_begin, plan.layer_end, plan.is_first(), plan.is_last()};
#ifdef LFM2_HAVE_CUDA
      if (use_cuda) {
        auto c = make_cuda_stage(*weights, range, dtype, world.local_rank, opt.tf32, opt.cuda_graphs,
                                 kNcclReservedSms);
        cuda_exec = c.get();
        exec = std::move(c);
      }
#endif
      if (!exec) exec = make_cpu_stage(*weights, range, n_threads);
      facts.bytes_read = weights->bytes_read();
      facts.load_us = int64_t((now_s() - t0) * 1e6);
      log_info(cat("read ", mib(facts.bytes_read), " of weights (layers ", plan.layer_begin, "-", plan.layer_end - 1,
                   ") from ", weight_path, " in ", int64_t((now_s() - t0) * 1000), " ms",
                   opt.verify_weights ? "" : " (digests not checked: --verify-weights off)"));
      if (last && !opt.answers.empty()) {
        answers = read_answers(opt.answers);
        check_answers(answers, N, cfg.vocab_size, opt.answers);
      }
#ifdef LFM2_HAVE_CUDA
      if (cuda_exec) {
        auto t = make_nccl_transport(pipe, *cuda_exec, opt.timeout_s);  // the replica's communicators only
        nccl = t.get();
        transport = std::move(t);
      }
#endif
      if (!transport) transport = make_mpi_transport(pipe, opt.timeout_s);
      // Each microbatch's hidden states and logits are checked for NaN / Inf as they are made.
      const CheckShape check{my_work.n_micro(), microbatch, cfg.hidden_size, cfg.vocab_size, my_work.seqs.begin};
      checked = make_checked_stage(*exec, range, check, n_threads, opt.allow_nonfinite);
      if (opt.max_new_tokens > 0) {
        const GenerateShape shape{my_work.seqs.size(), my_work.width, microbatch, cfg.hidden_size, opt.max_new_tokens,
                                  my_lengths};
        check_state_fits(*checked, shape, use_cuda);
        pipeline = std::make_unique<Pipeline>(pipe, *checked, *transport, cfg.hidden_size, shape.max_item_tokens());
        generate = std::make_unique<GenerateJob>(pipe, *checked, shape, sampling_params(opt, my_work.seqs.begin));
      } else {
        // The logits cross to the host only for someone who reads them: the output file, or answers
        // to compare (not in a benchmark, which validates the top-1 only). Every replica's last
        // stage must know, and only the job's last rank reads the answers: any answers count.
        const bool want_logits = !opt.benchmark && (!opt.output.empty() || !opt.answers.empty());
        PipelineShape shape{my_work.seqs.size(), my_work.width, microbatch, cfg.hidden_size, cfg.vocab_size,
                            want_logits, opt.all_logits, my_lengths};
        pipeline = std::make_unique<Pipeline>(pipe, *checked, *transport, cfg.hidden_size, shape.max_micro_tokens());
        score = std::make_unique<ScoreJob>(pipe, *checked, shape);
      }
      pipeline->set_tracing(!opt.trace.empty());
      install_kill_hook(*pipeline, world.rank);
#ifdef LFM2_HAVE_CUDA
      if (cuda_exec) {
        busy_timer = make_cuda_busy_timer(*cuda_exec);
        pipeline->set_busy_timer(busy_timer.get());
        nccl->set_timeline([t = busy_timer.get()] { return t->origin(); });
        const GpuInfo g = gpu_info(cuda_exec->device());  // free memory after every allocation
        facts.gpu = g.device;
        facts.gpu_weight_bytes = exec->weight_bytes();
        facts.gpu_free = g.free_bytes;
        facts.gpu_total = g.total_bytes;
      }
#endif
    });
  fault_point(world.rank, "agreement");
  if (!all_ready(world, ok, opt.timeout_s, "the ready agreement")) return kExitError;

#ifdef LFM2_HAVE_CUDA
  // ---- phase B': each replica's NCCL communicators (after every buffer), their warm-up; agreed.
  if (nccl) {
    const double t0 = now_s();
    ok = startup_step([&] { nccl->connect(); });
    if (!all_ready(world, ok, opt.timeout_s, "the NCCL agreement")) return kExitError;
    if (r0)
      log_info(cat("nccl: communicators of ", P, " ranks", R > 1 ? cat(" in each of ", R, " replicas") : std::string(),
                   " and warm-up exchange in ", int64_t((now_s() - t0) * 1000), " ms"));
  }
#endif

  // ---- phase C: the exchange. From here on an error ends the whole job.
  try {
    const auto all = gather_facts(world, facts, opt.timeout_s);
    RankSetup setup;
    setup.world = world;
    setup.pipe = pipe;
    setup.layout = layout;
    setup.work = work;
    setup.opt = opt;
    setup.cfg = cfg;
    setup.plans = plans;
    setup.n_seq = N;
    setup.seq_len = S;
    setup.microbatch = microbatch;
    setup.dtype = dtype;
    setup.use_cuda = use_cuda;
    setup.inputs = std::move(inputs);
    setup.answers = std::move(answers);
    setup.pipeline = pipeline.get();
    if (r0)
      print_plan(setup, plan_text(opt, weights->is_stage_file(), use_cuda, n_threads, transport->name()), all, gpus,
                 rep.hosts());
    std::vector<StartupFacts> startup;
    for (const RankFacts& f : all) startup.push_back({f.started_us, f.load_us, f.bytes_read});
    const int64_t first_micro_us = wall_now_us();  // rank 0's first microbatch enters the pipeline next
    const JobOutcome out = score ? run_scoring(setup, *score) : run_generation(setup, *generate);
    deliver_report(world, out.lines, opt.timeout_s);
    if (r0) log_info(startup_line(world, startup, first_micro_us));
    const int code =
        int(allreduce_max(world, {out.code}, unnamed_wait_s(world, opt.timeout_s), "the exit agreement")[0]);
    if (r0 && !out.done.empty()) log_info(cat(out.done, ", exit ", code));
    return code;
  } catch (const std::exception& e) {
    abort_job(world, e);
  }
}

}  // namespace lfm2
