// lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (one stage per rank).
//
//   mpirun -np 4 lfm2-rank --model model.h5 --inputs inputs.h5 --answers answers.h5 --output out.h5
//
// With no arguments it runs and validates the shipped default under data/default (docs/pipeline.md).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <functional>

#include "common/error.h"
#include "common/log.h"
#include "common/pending_file.h"
#include "rank/fatal.h"
#include "rank/options.h"
#include "rank/world.h"

namespace {

// A CLI11 check that reads the value as a number and says plainly what it must be.
CLI::Validator number_check(const std::string& must_be, std::function<bool(double)> ok) {
  return CLI::Validator(
      [must_be, ok](std::string& v) {
        size_t used = 0;
        double x = 0;
        try {
          x = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != v.size()) return "not a number: " + v;
        return ok(x) ? std::string() : "must be " + must_be + ", got " + v;
      },
      must_be);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lfm2;
  std::unique_ptr<MpiSession> mpi;
  WorldConfig world;
  try {
    mpi = std::make_unique<MpiSession>(&argc, &argv);
    world = query_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lfm2-rank: error: %s\n", e.what());
    return kExitError;
  }
  set_log_prefix(cat("[rank ", world.rank, "] "));
  remove_pending_files_on_signals();  // an interrupted job leaves no OUT.h5.tmp.<pid> behind

  RankOptions opt;
  CLI::App app{
      "lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (mpirun -np P lfm2-rank ...).\n"
      "With no arguments: runs and validates the shipped default under data/default."};
  app.add_option("--model", opt.model, "weight file (h5pack), or a per-stage pattern such as 'stage-%d.h5'");
  app.add_option("--inputs", opt.inputs, "HDF5 file with input_ids int32 [N, S]");
  app.add_option("--answers", opt.answers, "HDF5 file with next_token [N] (and logits [N, V]) to validate against");
  app.add_option("--output", opt.output, "write next_token, logits (and all_logits) here, atomically");
  app.add_option("--microbatch", opt.microbatch, "sequences per microbatch (default: about 4 microbatches per rank)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dtype", opt.dtype, "activation / compute dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  bool fp16 = false;
  app.add_flag("--fp16", fp16, "alias of --dtype fp16");
  app.add_option("--device", opt.device, "backend: auto is cuda when built with it and every rank sees a GPU")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--tf32", opt.tf32, "CUDA fp32: TF32 tensor cores for the GEMMs (validated at fp16's tolerance)");
  app.add_flag("--all-logits", opt.all_logits, "also write the logits of every position (all_logits [N, S, V])");
  auto* bench = app.add_flag("--benchmark", opt.benchmark, "warm-up, timed repetitions, throughput and bubble");
  app.add_option("--repeat", opt.repeat, "timed repetitions in benchmark mode")
      ->capture_default_str()
      ->needs(bench)
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", opt.warmup, "untimed repetitions before them")
      ->capture_default_str()
      ->needs(bench)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--layers", opt.layers, "layers per rank, e.g. 6,6,6,6 (default: balanced by cost)");
  app.add_option("--threads", opt.threads, "CPU threads per rank (default: the node's cores / ranks on the node)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", opt.timeout_s, "seconds any wait for another rank may take before the job aborts")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* gen = app.add_option("--max-new-tokens", opt.max_new_tokens,
                             "generate this many tokens after each prompt (greedy unless --temperature)")
                  ->check(number_check("a whole number >= 1", [](double v) { return v >= 1 && v == std::floor(v); }));
  app.add_option("--temperature", opt.temperature, "sampling temperature (0: greedy)")
      ->needs(gen)
      ->check(number_check("a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }));
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0: all)")
      ->needs(gen)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", opt.top_p, "then among the smallest set whose probability reaches p, in (0, 1]")
      ->needs(gen)
      ->check(number_check("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
  app.add_option("--seed", opt.seed, "sampling seed (the same seed gives the same tokens for any P and microbatch)")
      ->needs(gen);
  app.add_option("--eos", opt.eos, "end-of-sequence token id (repeatable): a sequence stops after it")->needs(gen);
  app.add_flag("--stream", opt.stream, "print sequence 0's tokens as they are generated")->needs(gen);
  app.add_option("--trace", opt.trace,
                 "write a timeline of the run (every rank's compute, transfers and waits) as Chrome "
                 "trace-event JSON (Perfetto, chrome://tracing, tools/trace_gantt.py)");
  std::string graphs = "on";
  app.add_option("--cuda-graphs", graphs, "CUDA: replay each stage's layers from a CUDA Graph captured once per shape")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.footer(
      "Exit codes: 0 ran (and validated), 1 bad input or error (one line from the rank that found it),\n"
      "2 validation failed, 3 aborted after the exchange started. Details: docs/pipeline.md");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same line; rank 0 speaks for all of them.
    if (world.rank == 0) {
      if (e.get_exit_code() == 0)
        app.exit(e);
      else
        log_error(e.what());
    }
    return e.get_exit_code() == 0 ? kExitOk : kExitError;
  }
  if (fp16) {
    if (app.count("--dtype") > 0 && opt.dtype != "fp16") {
      if (world.rank == 0) log_error(cat("--fp16 and --dtype ", opt.dtype, " disagree"));
      return kExitError;
    }
    opt.dtype = "fp16";
  }
  opt.cuda_graphs = graphs == "on";
  opt.use_default = opt.model.empty() && opt.inputs.empty();
  return run_rank(world, opt);
}
