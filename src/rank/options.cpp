// The command line of lfm2-rank (CLI11): every option, its check, its help line.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <functional>

#include <mpi.h>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/log.h"
#include "lfm2/build_info.h"
#include "common/parallel.h"
#include "rank/jobs/text_front_end.h"
#include "rank/mpi/fatal.h"
#include "rank/options.h"

namespace lfm2 {
namespace {

// Options whose text becomes a RankOptions field after parsing.
struct Spelled {
  bool fp16 = false, quiet = false, verbose = false;
  std::string graphs = "on", verify = "on", prefill_first = "on";
  std::vector<std::string> eos;  // ids, or "none"
};

// An --eos value: a token id or "none".
CLI::Validator eos_id() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "none") return "";
        std::string t = text;
        return cli::whole(0, INT32_MAX)(t);
      },
      "ID|none", "eos");
}

// --version: this build and what it was built with, and the MPI library it runs with.
std::string version_text() {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string running(mpi, size_t(len));
  running = running.substr(0, running.find_first_of(",\n"));
  return cat("lfm2-rank ", LFM2_VERSION, " (commit ", LFM2_COMMIT, ", ", LFM2_BUILD_TYPE, ")\nbuilt with: CUDA ",
             LFM2_CUDA_VERSION, ", NCCL ", LFM2_NCCL_VERSION, ", ", LFM2_MPI_VERSION, " (running ", running,
             "), HDF5 ", LFM2_HDF5_VERSION, ", ", LFM2_COMPILER);
}

// What runs and how: files, the split, the backend, benchmark, limits.
void add_run_options(CLI::App& app, RankOptions& opt, Spelled& x) {
  app.add_option("--model", opt.model, "weight file (h5pack), or a per-stage pattern such as 'stage-%d.h5'")
      ->check(cli::path());
  auto* inputs = app.add_option("--inputs", opt.inputs, "HDF5 file with input_ids int32 [N, S]")->check(cli::path());
  app.add_option("--prompts", opt.prompts,
                 "requests as JSONL ({\"prompt\": ...}, {\"messages\": [...]} or {\"input_ids\": [...]}; docs/text.md), "
                 "encoded with the model's tokenizer and chat template into RESULTS' stem + .inputs.h5; implies "
                 "generation")
      ->check(cli::path())
      ->excludes(inputs);
  app.add_option("--results", opt.results,
                 "generation: write the answers as text here, one JSON line per request (id, text, token_ids, "
                 "finish_reason, usage)")
      ->check(cli::path());
  app.add_option("--answers", opt.answers, "HDF5 file with next_token [N] (and logits [N, V]) to validate against")
      ->check(cli::path());
  app.add_option("--output", opt.output, "write next_token, logits (and all_logits) here, atomically")
      ->check(cli::path());
  app.add_option("--microbatch", opt.microbatch, "sequences per microbatch (default: about 4 microbatches per rank)")
      ->check(cli::whole(1, INT64_MAX));
  app.add_option("--pipeline", opt.pipeline,
                 "stages per pipeline: mpirun -np R*P runs R replicas of a P-stage pipeline, each on a block of the "
                 "sequences (default: all ranks, one pipeline)")
      ->check(cli::whole(1, 1 << 20));
  app.add_option("--dtype", opt.dtype, "activation / compute dtype")
      ->capture_default_str()
      ->check(cli::one_of({"fp32", "bf16", "fp16"}));
  app.add_flag("--fp16", x.fp16, "alias of --dtype fp16");
  app.add_option("--kv-dtype", opt.kv_dtype,
                 "generation's KV cache: auto (the compute dtype) or fp8 (e4m3 with an fp32 scale per position and KV "
                 "head: half the cache bytes of bf16; CUDA: --dtype bf16 / fp16)")
      ->capture_default_str()
      ->check(cli::one_of({"auto", "fp8"}));
  app.add_option("--device", opt.device, "backend: auto is cuda when built with it and every rank sees a GPU")
      ->capture_default_str()
      ->check(cli::one_of({"auto", "cpu", "cuda"}));
  app.add_flag("--tf32", opt.tf32, "CUDA fp32: TF32 tensor cores for the GEMMs (validated at fp16's tolerance)");
  app.add_flag("--all-logits", opt.all_logits, "also write the logits of every position (all_logits [N, S, V])");
  auto* bench = app.add_flag("--benchmark", opt.benchmark, "warm-up, timed repetitions, throughput and bubble");
  app.add_option("--repeat", opt.repeat, "timed repetitions in benchmark mode")
      ->capture_default_str()
      ->needs(bench)
      ->check(cli::whole(1, 1000000));
  app.add_option("--warmup", opt.warmup, "untimed repetitions before them")
      ->capture_default_str()
      ->needs(bench)
      ->check(cli::whole(0, 1000000));
  app.add_option("--layers", opt.layers, "layers per rank, e.g. 6,6,6,6 (default: balanced by cost)")
      ->check(cli::whole_list(1, 1 << 20));
  app.add_option("--threads", opt.threads, "CPU threads per rank (default: the node's cores / ranks on the node)")
      ->check(cli::whole(0, kMaxThreads));
  app.add_option("--timeout", opt.timeout_s,
                 "seconds any wait for another rank may take (MPI's start and end included) before the job aborts")
      ->capture_default_str()
      ->check(cli::seconds(kMaxTimeoutS));
  app.add_flag("--allow-nonfinite", opt.allow_nonfinite,
               "go on past NaN / Inf in the hidden states or logits, with a warning (for debugging)");
}

// Continuous batching: the scheduler, its limits and the pool of KV pages.
void add_batching_options(CLI::App& app, RankOptions& opt, Spelled& x) {
  app.add_option("--scheduler", opt.scheduler,
                 "generation: continuous (prompts stream through a pool of KV pages, each sequence retires at its "
                 "end) or static (every sequence's state at once, fixed microbatches)")
      ->capture_default_str()
      ->check(cli::one_of({"continuous", "static"}));
  app.add_option("--max-seqs", opt.max_seqs, "continuous: sequences running at once (state slots)")
      ->capture_default_str()
      ->check(cli::whole(1, int64_t(1) << 20));
  app.add_option("--max-batched-tokens", opt.max_batched_tokens,
                 "continuous: rows per step, decode rows first, then prompt chunks (default: 8192)")
      ->check(cli::whole(1, int64_t(1) << 24));
  app.add_option("--admit-wave", opt.admit_wave,
                 "continuous: while others decode, new prompts wait for this many free slots and come together (a "
                 "step with prompt rows reads the experts once more; default: --max-seqs / 24, at least 1)")
      ->check(cli::whole(1, int64_t(1) << 20));
  app.add_option("--prefill-first", x.prefill_first,
                 "continuous: a wave of prompts (or a prompt's next chunk) gets steps of its own while the running "
                 "sequences' decode rows wait (on: vLLM V0's order), or rides with them (off: chunked prefill, V1's)")
      ->capture_default_str()
      ->check(cli::one_of({"on", "off"}));
  app.add_option("--page-size", opt.page_size,
                 "continuous: positions per KV page, a power of two >= 16 (default: 16, 64 or 256 as sequences grow)")
      ->check(cli::whole(16, int64_t(1) << 16));
  app.add_option("--kv-pages", opt.kv_pages, "continuous: KV pages in the pool (default: from --gpu-memory on a GPU)")
      ->check(cli::whole(1, int64_t(1) << 31));
  app.add_option("--prefill-chunk", opt.prefill_chunk,
                 "static: prompt rows a prefill step holds at most (0: whole prompts; continuous: "
                 "--max-batched-tokens)")
      ->check(cli::whole(0, int64_t(1) << 24));
  app.add_flag("--resume", opt.resume,
               "continuous: go on from the journal of a killed or failed job with the same --output (its finished "
               "sequences are neither run again nor lost)");
  app.add_option("--metrics", opt.metrics,
                 "continuous: write the run's metrics here as JSON (throughput; time to first token and per output "
                 "token per sequence, p50/p90/p99; slot occupancy; preemptions)")
      ->check(cli::path());
  app.add_option("--gpu-memory", opt.gpu_memory,
                 "continuous: the fraction of each GPU's memory the job may fill (weights, buffers, the pool)")
      ->capture_default_str()
      ->check(cli::real("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
}

// --max-new-tokens and how the tokens are chosen.
void add_generation_options(CLI::App& app, RankOptions& opt, Spelled& x) {
  app.add_option("--max-new-tokens", opt.max_new_tokens,
                 "generate this many tokens after each prompt (greedy unless --temperature; with --prompts the "
                 "default is the model's generation_config max_new_tokens, else 256, at most what its positions "
                 "allow)")
      ->check(cli::whole(1, int64_t(1) << 30));
  app.add_option("--temperature", opt.temperature, "sampling temperature (0: greedy)")
      ->check(cli::real("a number in [0, 1e6]", [](double v) { return v >= 0 && v <= 1e6; }));
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0: all)")
      ->check(cli::whole(0, int64_t(1) << 30));
  app.add_option("--top-p", opt.top_p, "then among the smallest set whose probability reaches p, in (0, 1]")
      ->check(cli::real("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
  app.add_option("--seed", opt.seed, "sampling seed (the same seed gives the same tokens for any P and microbatch)")
      ->check(cli::unsigned64());
  app.add_option("--eos", x.eos,
                 "end-of-sequence token id (repeatable): a sequence stops after it (default: the model's "
                 "generation_config eos_token_id; 'none': no EOS)")
      ->check(eos_id());
  app.add_flag("--stream", opt.stream,
               "print every token as it is generated, one JSON line each on stdout ({\"seq\": N, \"token\": ID}, "
               "{\"seq\": N, \"done\": true}; the run's own lines go to stderr): tools/lfm2_text.py stream turns "
               "them into text");
  add_batching_options(app, opt, x);
}

// The options that only generation takes: with neither --max-new-tokens nor --prompts, one is an error.
constexpr const char* kGenerationOnly[] = {
    "--temperature", "--top-k",        "--top-p",      "--seed",   "--eos",    "--stream",
    "--scheduler",   "--max-seqs",     "--max-batched-tokens",     "--page-size", "--kv-pages",
    "--prefill-chunk", "--resume",     "--metrics",    "--gpu-memory", "--results"};

// How the run is watched, replayed and loaded: --trace, --cuda-graphs, --verify-weights.
void add_detail_options(CLI::App& app, RankOptions& opt, Spelled& x) {
  app.add_option("--trace", opt.trace,
                 "write a timeline of the run (every rank's compute, transfers and waits) as Chrome "
                 "trace-event JSON (Perfetto, chrome://tracing, tools/trace_gantt.py)")
      ->check(cli::path());
  app.add_option("--cuda-graphs", x.graphs, "CUDA: replay each stage's layers from a CUDA Graph captured once per shape")
      ->capture_default_str()
      ->check(cli::one_of({"on", "off"}));
  app.add_option("--verify-weights", x.verify,
                 "check every tensor against its digest as it is loaded (off: trusted files, e.g. just checked with "
                 "h5pack verify; the model fingerprints are compared either way)")
      ->capture_default_str()
      ->check(cli::one_of({"on", "off"}));
}

// --prompts / --results / --eos none and the options only generation takes; "" when they agree.
std::string check_text_options(const CLI::App& app, RankOptions& opt, const Spelled& x) {
  if (!opt.prompts.empty() && opt.results.empty())
    return "--prompts needs --results FILE.jsonl (where the text answers go)";
  if (!opt.prompts.empty() && opt.max_new_tokens == 0) opt.max_new_tokens = kPromptsDefaultNewTokens;
  if (!opt.results.empty() && opt.prompts.empty() && opt.inputs.empty())
    return "--results needs --prompts, or --inputs made by tools/lfm2_text.py encode";
  if (opt.max_new_tokens == 0)
    for (const char* name : kGenerationOnly)
      if (app.count(name) > 0) return cat(name, " requires --max-new-tokens (or --prompts)");
  const bool none = std::find(x.eos.begin(), x.eos.end(), "none") != x.eos.end();
  if (none && x.eos.size() > 1) return "--eos none excludes other --eos ids";
  if (opt.stream && opt.benchmark) return "--stream excludes --benchmark (its runs repeat every token)";
  if (!opt.results.empty() && (opt.benchmark || opt.all_logits))
    return cat("--results excludes ", opt.benchmark ? "--benchmark" : "--all-logits");
  return "";
}

}  // namespace

ParsedOptions parse_options(int argc, char** argv, bool print_help) {
  ParsedOptions p;
  RankOptions& opt = p.opt;
  Spelled x;
  CLI::App app{
      "lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (mpirun -np P lfm2-rank ...).\n"
      "With no arguments: runs and validates the shipped default under data/default."};
  add_run_options(app, opt, x);
  add_generation_options(app, opt, x);
  add_detail_options(app, opt, x);
  app.add_flag("-q,--quiet", x.quiet, "errors and warnings only (also LFM2_LOG_LEVEL=quiet)");
  app.add_flag("-v,--verbose", x.verbose, "also the details: the text front end's commands (LFM2_LOG_LEVEL=verbose)");
  app.set_version_flag("--version", version_text(), "version, commit, and the CUDA / NCCL / MPI / HDF5 of the build");
  app.footer(
      "Exit codes: 0 ran (and validated), 1 bad input or error (one line from the rank that found it),\n"
      "2 validation failed, 3 aborted (a rank failed after the exchange began, or a wait timed out),\n"
      "4 NaN/Inf found. Details: docs/pipeline.md");
  try {
    app.parse(argc, argv);
    if (x.fp16 && app.count("--dtype") > 0 && opt.dtype != "fp16")
      p.error = cat("--fp16 and --dtype ", opt.dtype, " disagree");
    if (p.error.empty()) p.error = check_text_options(app, opt, x);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      if (print_help) app.exit(e);  // --help
      p.code = kExitOk;
    } else {
      p.error = e.what();
    }
  }
  if (!p.error.empty()) p.code = kExitError;
  if (p.code >= 0) return p;
  if (x.fp16) opt.dtype = "fp16";
  if (!opt.prompts.empty()) {
    opt.inputs = derived_path(opt.results, ".inputs.h5");
    if (opt.output.empty()) opt.output = derived_path(opt.results, ".outputs.h5");
  } else if (!opt.results.empty() && opt.output.empty()) {
    opt.output = derived_path(opt.results, ".outputs.h5");
  }
  for (const std::string& e : x.eos)
    if (e != "none") opt.eos.push_back(std::stoll(e));
  opt.eos_off = !x.eos.empty() && opt.eos.empty();
  opt.eos_source = opt.eos.empty() ? "" : "--eos";
  opt.cuda_graphs = x.graphs == "on";
  opt.prefill_first = x.prefill_first == "on";
  opt.verify_weights = x.verify == "on";
  opt.use_default = opt.model.empty() && opt.inputs.empty();
  opt.max_new_default = !opt.prompts.empty() && app.count("--max-new-tokens") == 0;
  opt.log_level = x.quiet ? 0 : x.verbose ? 2 : -1;  // -1: LFM2_LOG_LEVEL's, else normal (main.cpp)
  return p;
}

}  // namespace lfm2
