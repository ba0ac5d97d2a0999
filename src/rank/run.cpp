// One lfm2-rank process from start-up to exit code.
//
// Start-up runs in two agreed phases so that a rank's failure stops every rank before any hidden
// state moves: (A) open this rank's weight file, rank 0 reads and checks the inputs; all agree and
// learn (N, S). (B) the plan, the stage-file check, loading the stage, the last rank's answers, the
// buffers; all agree again. On CUDA, (B') the NCCL communicator and its warm-up exchange, agreed
// once more. Then (C) the exchange, where any error aborts the job.
//
// The GPU: node-local rank r takes device r of those it sees (a rank beyond the count is an error),
// and every rank gathers every rank's GPU uuid before loading, so that two ranks on one GPU fail
// with one line instead of sharing its memory.
#include <sched.h>
#include <unistd.h>

#include <chrono>
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
#include "rank/benchmark.h"
#include "rank/fatal.h"
#include "rank/fault_hook.h"
#include "rank/gpu_identity.h"
#include "rank/options.h"
#include "rank/pipeline.h"
#include "rank/run_outputs.h"
#include "rank/same_model.h"
#include "rank/stage_plan.h"
#include "rank/transport.h"
#include "rank/validate.h"
#ifdef LFM2_HAVE_CUDA
#include "rank/cuda_rank.h"
#endif

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

constexpr int kReportTag = 32767;

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

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
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

// The last rank's report lines reach rank 0, which prints them.
void deliver_report(const WorldConfig& world, const std::vector<std::string>& lines, double timeout_s) {
  if (world.size == 1) {
    for (const auto& l : lines) log_info(l);
    return;
  }
  if (world.is_last()) {
    const std::string text = nlohmann::json(lines).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    MPI_Request req;
    MPI_CHECK(MPI_Isend(text.data(), int(text.size()), MPI_CHAR, 0, kReportTag, world.comm, &req),
              "sending the report");
    wait_mpi_request(&req, timeout_s, "sending the report to rank 0");
  } else if (world.is_first()) {
    MPI_Status st;
    int flag = 0;
    auto arrived = [&] {
      MPI_CHECK(MPI_Iprobe(world.size - 1, kReportTag, world.comm, &flag, &st), "waiting for the report");
      return flag != 0;
    };
    if (!poll_until(arrived, timeout_s))
      LFM2_TIMEOUT("timed out after ", timeout_s, " s waiting for the last rank's report (see --timeout)");
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(size_t(n), '\0');
    MPI_CHECK(MPI_Recv(text.data(), n, MPI_CHAR, world.size - 1, kReportTag, world.comm, MPI_STATUS_IGNORE),
              "receiving the report");
    for (const auto& l : nlohmann::json::parse(text)) log_info(l.get<std::string>());
  }
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// ", smallest top-1 margin 0.012 (sequence 17)": how close the closest call of the run was.
std::string smallest_margin(const std::vector<float>& margin) {
  if (margin.empty()) return "";
  size_t at = 0;
  for (size_t i = 1; i < margin.size(); ++i)
    if (margin[i] < margin[at] || margin[at] != margin[at]) at = i;
  return cat("; smallest top-1 margin ", margin[at], " (sequence ", at, ")");
}

// The run report of a plain run: each stage's busy time and the bubble, measured and GPipe's.
std::vector<std::string> pipeline_report(const std::vector<StageTiming>& timing, const std::vector<StagePlan>& plans,
                                         int64_t n_micro) {
  std::vector<std::string> lines;
  double wall = 0, busy = 0, lo = 1e300, hi = 0;
  for (const StageTiming& t : timing) {
    wall = std::max(wall, t.wall_s);
    busy += t.busy_s;
    lo = std::min(lo, t.busy_s);
    hi = std::max(hi, t.busy_s);
  }
  std::string stages = "pipeline: busy per stage";
  for (size_t r = 0; r < timing.size(); ++r)
    stages += cat(r ? ", " : " ", fixed(timing[r].busy_s, 4), " s (layers ", plans[r].layer_begin, "-",
                  plans[r].layer_end - 1, ")");
  lines.push_back(stages + cat("; spread ", fixed(hi > 0 ? 100 * (hi - lo) / hi : 0, 1), "%"));
  const int P = int(timing.size());
  lines.push_back(cat("pipeline: wall ", fixed(wall, 4), " s; bubble ",
                      fixed(wall > 0 ? 100 * (1 - busy / (P * wall)) : 0, 1), "% measured, GPipe ",
                      fixed(100 * gpipe_bubble(P, n_micro), 1), "% for ", n_micro, " microbatches"));
  return lines;
}

// Each rank's busy and wall time of one run, gathered to rank 0 (the run report).
std::vector<StageTiming> gather_timing(const WorldConfig& world, const StageTiming& mine, double timeout_s) {
  std::vector<StageTiming> all(size_t(world.size));
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, world.comm, &req), "gathering stage times");
  wait_mpi_request(&req, timeout_s, "gathering stage times");
  return all;
}

// Every rank's trace events to rank 0, which writes the file (whole or not at all).
void deliver_trace(const WorldConfig& world, const Pipeline& pipeline, const std::vector<StagePlan>& plans,
                   const RankOptions& opt, double timeout_s) {
  const StagePlan& p = plans[size_t(world.rank)];
  const std::string label = cat("rank ", world.rank, ": layers ", p.layer_begin, "-", p.layer_end - 1,
                                world.size > 1 ? cat(" on ", world.host) : std::string());
  const std::vector<std::string> all = gather_strings(world, trace_events_json(world.rank, label, pipeline.trace()),
                                                      timeout_s, "gathering the trace");
  if (!world.is_first()) return;
  const nlohmann::json meta = {{"tool", "lfm2-rank"},        {"ranks", world.size},
                               {"microbatch", pipeline.shape().microbatch},
                               {"microbatches", pipeline.shape().n_micro()},
                               {"sequences", pipeline.shape().n_seq}, {"seq_len", pipeline.shape().seq_len},
                               {"dtype", opt.dtype},        {"created", utc_now()}};
  write_trace_file(opt.trace, all, meta.dump());
  log_info(cat("trace: wrote ", opt.trace, " (", pipeline.trace().size(), " spans on rank 0; open it in Perfetto or ",
               "draw it with tools/trace_gantt.py)"));
}

}  // namespace

int run_rank(const WorldConfig& world, RankOptions opt) {
  const bool r0 = world.is_first(), last = world.is_last();
  const int P = world.size;

  // ---- phase A: options, this rank's weight file, the inputs (rank 0).
  bool ok = startup_step([&] { check_backend(opt); }, r0);
  if (ok && opt.use_default) ok = startup_step([&] { resolve_default(opt); }, r0);
  if (ok && (opt.model.empty() || opt.inputs.empty()))
    ok = startup_step([&] { LFM2_FAIL("give both --model and --inputs (or neither, for the shipped default)"); }, r0);
  // Rank 0 writes the trace, the last rank the output: each is writable and no input, or fails now.
  if (ok && (r0 || last))
    ok = startup_step([&] { check_run_outputs(opt, world, [&](int r) { return weight_path_for(opt.model, r); }); });
  std::string weight_path;
  std::unique_ptr<WeightReader> weights;
  TokenInputs inputs;
  if (ok)
    ok = startup_step([&] {
      weight_path = weight_path_for(opt.model, world.rank);
      weights = std::make_unique<WeightReader>(weight_path);
    });
  if (ok && r0)
    ok = startup_step([&] {
      inputs = read_inputs(opt.inputs);
      const ModelConfig& cfg = weights->config();
      check_inputs(inputs, cfg.vocab_size, cfg.max_position_embeddings, opt.inputs);
    });
  // Every rank's file holds the same model (fingerprints), or rank 0 names two that differ.
  const bool same = startup_step([&] { check_same_model(world, weights.get(), weight_path, opt.timeout_s); });
  ok = ok && same;
  // --device auto: CUDA only when every rank sees a GPU (one transport for the whole job).
  int64_t no_gpu = 1;
#ifdef LFM2_HAVE_CUDA
  if (opt.device != "cpu") no_gpu = visible_gpu_count() > 0 ? 0 : 1;
#endif
  const auto agreed = allreduce_max(world, {ok ? 0 : 1, inputs.n_seq, inputs.seq_len, no_gpu}, opt.timeout_s,
                                    "the start-up agreement");
  if (agreed[0] != 0) return report_startup_errors(world, opt.timeout_s);
  const int64_t N = agreed[1], S = agreed[2];
  const bool use_cuda = opt.device == "cuda" || (opt.device == "auto" && agreed[3] == 0);
  const DType dtype = use_cuda ? parse_dtype(opt.dtype) : DType::F32;

  // ---- phase B: the plan, this rank's stage, the answers (last rank), the buffers.
  const ModelConfig& cfg = weights->config();
  std::vector<StagePlan> plans;
  ok = startup_step(
      [&] {
        const int L = int(cfg.num_hidden_layers);
        LFM2_CHECK(P <= L, "cannot run ", P, " ranks: the model has ", L, " layers (one rank needs at least one)");
        // Stage files were cut by `h5pack split` with the default plan (seq_len 32, last-position
        // head); a whole-model file lets the split balance this run's own sequence length.
        if (!opt.layers.empty())
          plans = make_stage_plans(parse_layer_counts(opt.layers, L, P));
        else if (weights->is_stage_file())
          plans = default_stage_plans(cfg, P);
        else
          plans = default_stage_plans(cfg, P, S, opt.all_logits, use_cuda ? CostModel::kGpu : CostModel::kFlops);
        if (!use_cuda) check_cpu_fallback(opt);
      },
      r0);
  const int n_threads = opt.threads > 0 ? opt.threads : default_threads(world);
  const int64_t microbatch = opt.microbatch > 0 ? std::min(opt.microbatch, N) : default_microbatch(N, S, P, use_cuda);
  std::unique_ptr<StageExecutor> exec, checked;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Pipeline> pipeline;
  TokenAnswers answers;
  RankFacts facts{};
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
      const StagePlan& plan = plans[size_t(world.rank)];
      if (weights->is_stage_file()) {
        const StageInfo s = weights->stage();
        LFM2_CHECK(s.stage == world.rank && s.n_stages == P && s.layer_begin == plan.layer_begin &&
                       s.layer_end == plan.layer_end,
                   weight_path, ": stage file for stage ", s.stage, "/", s.n_stages, " layers [", s.layer_begin, ", ",
                   s.layer_end, "), but rank ", world.rank, "/", P, " runs layers [", plan.layer_begin, ", ",
                   plan.layer_end, ")",
                   opt.layers.empty() ? " (split it for this plan, or pass its split as --layers)" : " (--layers)");
      }
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
        auto c = make_cuda_stage(*weights, range, dtype, world.local_rank, opt.tf32, opt.cuda_graphs);
        cuda_exec = c.get();
        exec = std::move(c);
      }
#endif
      if (!exec) exec = make_cpu_stage(*weights, range, n_threads);
      facts.bytes_read = weights->bytes_read();
      log_info(cat("read ", mib(facts.bytes_read), " of weights (layers ", plan.layer_begin, "-", plan.layer_end - 1,
                   ") from ", weight_path, " in ", int64_t((now_s() - t0) * 1000), " ms"));
      if (last && !opt.answers.empty()) {
        answers = read_answers(opt.answers);
        check_answers(answers, N, cfg.vocab_size, opt.answers);
      }
#ifdef LFM2_HAVE_CUDA
      if (cuda_exec) {
        auto t = make_nccl_transport(world, *cuda_exec, opt.timeout_s);
        nccl = t.get();
        transport = std::move(t);
      }
#endif
      if (!transport) transport = make_mpi_transport(world, opt.timeout_s);
      // The logits cross to the host only for someone who reads them: the output file, or answers
      // with logits to compare (not in a benchmark, which validates the top-1 only).
      const bool want_logits = !opt.benchmark && (!opt.output.empty() || answers.has_logits());
      PipelineShape shape{N, S, microbatch, cfg.hidden_size, cfg.vocab_size, want_logits, opt.all_logits};
      // Each microbatch's hidden states and logits are checked for NaN / Inf as they are made.
      checked = make_checked_stage(*exec, range, {shape.n_micro(), microbatch, cfg.hidden_size, cfg.vocab_size},
                                   n_threads, opt.allow_nonfinite);
      pipeline = std::make_unique<Pipeline>(world, *checked, *transport, shape);
      pipeline->set_tracing(!opt.trace.empty());
      install_kill_hook(*pipeline, world.rank);
#ifdef LFM2_HAVE_CUDA
      if (cuda_exec) {
        busy_timer = make_cuda_busy_timer(*cuda_exec);
        pipeline->set_busy_timer(busy_timer.get());
        nccl->set_timeline(busy_timer.get());
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
  // ---- phase B': the NCCL communicator (after every buffer), its warm-up exchange; agreed.
  if (nccl) {
    const double t0 = now_s();
    ok = startup_step([&] { nccl->connect(); });
    if (!all_ready(world, ok, opt.timeout_s, "the NCCL agreement")) return kExitError;
    if (r0)
      log_info(cat("nccl: communicator of ", P, " ranks and warm-up exchange in ", int64_t((now_s() - t0) * 1000),
                   " ms"));
  }
#endif

  // ---- phase C: the exchange. From here on an error ends the whole job.
  try {
    const auto all = gather_facts(world, facts, opt.timeout_s);
    const int64_t M = pipeline->shape().n_micro();
    if (r0) {
      log_info(cat("plan: ", P, " ranks over ", cfg.num_hidden_layers, " layers (",
                   !opt.layers.empty()         ? "--layers " + opt.layers
                   : weights->is_stage_file() ? std::string("as the stage files were split")
                   : use_cuda                  ? std::string("balanced by the GPU cost model")
                                               : std::string("balanced by FLOPs"),
                   "); ", N, " x ", S,
                   " tokens in ", M, " microbatches of ", microbatch, " (GPipe bubble ",
                   fixed(100 * gpipe_bubble(P, M), 1), "%); ",
                   use_cuda ? cat("cuda ", opt.dtype, opt.dtype != "fp32" ? "" : opt.tf32 ? " (TF32)" : " (TF32 off)")
                            : cat("cpu fp32, threads per rank ", n_threads),
                   use_cuda ? cat(", CUDA graphs ", opt.cuda_graphs ? "on" : "off") : std::string(),
                   ", transport ", transport->name()));
      for (int r = 0; r < P; ++r) {
        const RankFacts& f = all[size_t(r)];
        log_info(cat("plan: rank ", r, " (local ", f.local_rank, "): layers ", f.layer_begin, "-", f.layer_end - 1,
                     " (", f.layer_end - f.layer_begin, "), weights ", mib(f.weight_bytes), ", read ",
                     mib(f.bytes_read), ", free host memory ", f.free_host < 0 ? std::string("?") : gib(f.free_host),
                     f.gpu < 0 ? std::string()
                               : cat("; GPU ", f.gpu, " ", gpus[size_t(r)].name, " (", gpus[size_t(r)].uuid_text, ") on ",
                                     gpus[size_t(r)].host, ": weights ", gib(f.gpu_weight_bytes), ", free ",
                                     gib(f.gpu_free), " of ", gib(f.gpu_total))));
      }
      if (M < P)
        log_info(cat("warning: ", M, " microbatches for ", P, " ranks: some ranks will idle (bubble ",
                     int(100 * gpipe_bubble(P, M)), "%); use a smaller --microbatch"));
    }

    PipelineResult result;
    const int32_t* ids = r0 ? inputs.ids.data() : nullptr;
    const double t0 = now_s();
    std::vector<std::string> bench_lines;
    if (opt.benchmark) {
      BenchmarkSummary b = run_benchmark(world, *pipeline, plans, ids, &result, opt.warmup, opt.repeat, opt.timeout_s);
      if (r0) bench_lines = b.report();
    } else {
      // A traced run starts together on every rank, so that the ranks' timelines line up.
      if (!opt.trace.empty()) allreduce_max(world, {0}, opt.timeout_s, "the trace's start");
      const StageTiming t = pipeline->run(ids, &result);
      const auto timing = gather_timing(world, t, opt.timeout_s);
      if (r0) bench_lines = pipeline_report(timing, plans, M);
    }
    const double run_s = now_s() - t0;
    for (const auto& l : bench_lines) log_info(l);
    if (!opt.trace.empty()) deliver_trace(world, *pipeline, plans, opt, opt.timeout_s);

    fault_point(world.rank, "output");
    int code = kExitOk;
    std::vector<std::string> lines;
    if (last) {
      std::string head = "results: next_token =";
      for (int64_t i = 0; i < std::min<int64_t>(N, 8); ++i) head += cat(" ", result.next_token[size_t(i)]);
      lines.push_back(head + (N > 8 ? " ..." : "") + smallest_margin(result.margin));
      nlohmann::json meta = {{"format", "lfm2-rank-outputs"},
                             {"model", opt.model},
                             {"inputs", opt.inputs},
                             {"n_ranks", P},
                             {"microbatch", microbatch},
                             {"n_microbatches", M},
                             {"layers", join([&] {
                                std::vector<int> c;
                                for (const auto& p : plans) c.push_back(p.n_layers());
                                return c;
                              }())},
                             {"dtype", dtype_name(dtype)},
                             {"tf32", use_cuda && opt.tf32},
                             {"device", use_cuda ? "cuda" : "cpu"},
                             {"all_logits", opt.all_logits},
                             {"created", utc_now()}};
      if (!opt.answers.empty()) {
        // TF32 keeps fp16's 10 mantissa bits, so a --tf32 run is held to fp16's tolerance.
        const DType vt = dtype == DType::F32 && use_cuda && opt.tf32 ? DType::F16 : dtype;
        const ValidationResult v =
            validate_outputs(result.next_token, result.logits, cfg.vocab_size, answers, tolerance_for(vt));
        for (const auto& l : v.report(vt)) lines.push_back(l);
        meta["validation"] = v.passed ? "PASS" : "FAIL";
        meta["top1_agree"] = v.agree;
        meta["max_abs_dlogit"] = v.max_abs_dlogit;
        meta["mean_abs_dlogit"] = v.mean_abs_dlogit;
        code = v.passed ? kExitOk : kExitValidationFailed;
      }
      if (!opt.output.empty()) {
        TokenOutputs out{N, S, cfg.vocab_size, result.next_token, result.logits, result.margin, result.all_logits};
        // A write that fails (a full disk) is this rank's error alone: the job ends together, exit 1.
        try {
          write_outputs(opt.output, out, meta);
          lines.push_back("wrote " + opt.output);
        } catch (const std::exception& e) {
          log_error(e.what());
          code = std::max(code, kExitError);
        }
      }
    }
    deliver_report(world, lines, opt.timeout_s);
    code = int(allreduce_max(world, {code}, opt.timeout_s, "the exit agreement")[0]);
    if (r0 && !opt.benchmark) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "done: %lld sequences x %lld tokens in %.3f s (%.1f samples/s), exit %d",
                    (long long)N, (long long)S, run_s, double(N) / run_s, code);
      log_info(buf);
    }
    return code;
  } catch (const std::exception& e) {
    abort_job(world, e);
  }
}

}  // namespace lfm2
