// The command line of lfm2-rank (CLI11): every option, its check, its help line.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <functional>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/parallel.h"
#include "rank/mpi/fatal.h"
#include "rank/options.h"

namespace lfm2 {
namespace {

// Options whose text becomes a RankOptions field after parsing.
struct Spelled {
  bool fp16 = false;
  std::string graphs = "on", verify = "on";
};

// What runs and how: files, the split, the backend, benchmark, limits.
void add_run_options(CLI::App& app, RankOptions& opt, Spelled& x) {
  app.add_option("--model", opt.model, "weight file (h5pack), or a per-stage pattern such as 'stage-%d.h5'")
      ->check(cli::path());
  app.add_option("--inputs", opt.inputs, "HDF5 file with input_ids int32 [N, S]")->check(cli::path());
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
void add_batching_options(CLI::App& app, RankOptions& opt, CLI::Option* gen) {
  app.add_option("--scheduler", opt.scheduler,
                 "generation: continuous (prompts stream through a pool of KV pages, each sequence retires at its "
                 "end) or static (every sequence's state at once, fixed microbatches)")
      ->capture_default_str()
      ->needs(gen)
      ->check(cli::one_of({"continuous", "static"}));
  app.add_option("--max-seqs", opt.max_seqs, "continuous: sequences running at once (state slots)")
      ->capture_default_str()
      ->needs(gen)
      ->check(cli::whole(1, int64_t(1) << 20));
  app.add_option("--max-batched-tokens", opt.max_batched_tokens,
                 "continuous: rows per step, decode rows first, then prompt chunks (default: 8192)")
      ->needs(gen)
      ->check(cli::whole(1, int64_t(1) << 24));
  app.add_option("--page-size", opt.page_size,
                 "continuous: positions per KV page, a power of two >= 16 (default: 16, 64 or 256 as sequences grow)")
      ->needs(gen)
      ->check(cli::whole(16, int64_t(1) << 16));
  app.add_option("--kv-pages", opt.kv_pages, "continuous: KV pages in the pool (default: from --gpu-memory on a GPU)")
      ->needs(gen)
      ->check(cli::whole(1, int64_t(1) << 31));
  app.add_option("--prefill-chunk", opt.prefill_chunk,
                 "static: prompt rows a prefill step holds at most (0: whole prompts; continuous: "
                 "--max-batched-tokens)")
      ->needs(gen)
      ->check(cli::whole(0, int64_t(1) << 24));
  app.add_flag("--resume", opt.resume,
               "continuous: go on from the journal of a killed or failed job with the same --output (its finished "
               "sequences are neither run again nor lost)")
      ->needs(gen);
  app.add_option("--metrics", opt.metrics,
                 "continuous: write the run's metrics here as JSON (throughput; time to first token and per output "
                 "token per sequence, p50/p90/p99; slot occupancy; preemptions)")
      ->needs(gen)
      ->check(cli::path());
  app.add_option("--gpu-memory", opt.gpu_memory,
                 "continuous: the fraction of each GPU's memory the job may fill (weights, buffers, the pool)")
      ->capture_default_str()
      ->needs(gen)
      ->check(cli::real("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
}

// --max-new-tokens and how the tokens are chosen.
void add_generation_options(CLI::App& app, RankOptions& opt) {
  auto* gen = app.add_option("--max-new-tokens", opt.max_new_tokens,
                             "generate this many tokens after each prompt (greedy unless --temperature)")
                  ->check(cli::whole(1, int64_t(1) << 30));
  app.add_option("--temperature", opt.temperature, "sampling temperature (0: greedy)")
      ->needs(gen)
      ->check(cli::real("a number in [0, 1e6]", [](double v) { return v >= 0 && v <= 1e6; }));
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0: all)")
      ->needs(gen)
      ->check(cli::whole(0, int64_t(1) << 30));
  app.add_option("--top-p", opt.top_p, "then among the smallest set whose probability reaches p, in (0, 1]")
      ->needs(gen)
      ->check(cli::real("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
  app.add_option("--seed", opt.seed, "sampling seed (the same seed gives the same tokens for any P and microbatch)")
      ->needs(gen)
      ->check(cli::unsigned64());
  app.add_option("--eos", opt.eos, "end-of-sequence token id (repeatable): a sequence stops after it")
      ->needs(gen)
      ->check(cli::whole(0, INT32_MAX));
  app.add_flag("--stream", opt.stream, "print sequence 0's tokens as they are generated")->needs(gen);
  add_batching_options(app, opt, gen);
}

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

}  // namespace

ParsedOptions parse_options(int argc, char** argv, bool print_help) {
  ParsedOptions p;
  RankOptions& opt = p.opt;
  Spelled x;
  CLI::App app{
      "lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (mpirun -np P lfm2-rank ...).\n"
      "With no arguments: runs and validates the shipped default under data/default."};
  add_run_options(app, opt, x);
  add_generation_options(app, opt);
  add_detail_options(app, opt, x);
  app.footer(
      "Exit codes: 0 ran (and validated), 1 bad input or error (one line from the rank that found it),\n"
      "2 validation failed, 3 aborted (a rank failed after the exchange began, or a wait timed out),\n"
      "4 NaN/Inf found. Details: docs/pipeline.md");
  try {
    app.parse(argc, argv);
    if (x.fp16 && app.count("--dtype") > 0 && opt.dtype != "fp16")
      p.error = cat("--fp16 and --dtype ", opt.dtype, " disagree");
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
  opt.cuda_graphs = x.graphs == "on";
  opt.verify_weights = x.verify == "on";
  opt.use_default = opt.model.empty() && opt.inputs.empty();
  return p;
}

}  // namespace lfm2
