// lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (one stage per rank), or as R replicas
// of a P-stage pipeline (--pipeline P over R x P ranks).
//
//   mpirun -np 4 lfm2-rank --model model.h5 --inputs inputs.h5 --answers answers.h5 --output out.h5
//   mpirun -np 4 lfm2-rank --pipeline 2 ...     # two replicas of a 2-stage pipeline
//
// With no arguments it runs and validates the shipped default under data/default (docs/pipeline.md).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/log.h"
#include "common/parallel.h"
#include "common/pending_file.h"
#include "io/h5_util.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/mpi/replica_comms.h"
#include "rank/mpi/watchdog.h"
#include "rank/mpi/world.h"
#include "rank/options.h"

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
  h5_no_exit_handlers();
  // Until MPI says otherwise, the launcher's environment tells this process its rank.
  const int launched_as = launcher_rank();
  set_log_prefix(cat("[rank ", launched_as, "] "));
  remove_pending_files_on_signals();  // an interrupted job leaves no OUT.h5.tmp.* behind
  fault_point(launched_as, "init");

  // The command line is parsed before MPI starts, so that --timeout bounds MPI's start as well.
  RankOptions opt;
  CLI::App app{
      "lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (mpirun -np P lfm2-rank ...).\n"
      "With no arguments: runs and validates the shipped default under data/default."};
  app.add_option("--model", opt.model, "weight file (h5pack), or a per-stage pattern such as 'stage-%d.h5'");
  app.add_option("--inputs", opt.inputs, "HDF5 file with input_ids int32 [N, S]");
  app.add_option("--answers", opt.answers, "HDF5 file with next_token [N] (and logits [N, V]) to validate against");
  app.add_option("--output", opt.output, "write next_token, logits (and all_logits) here, atomically");
  app.add_option("--microbatch", opt.microbatch, "sequences per microbatch (default: about 4 microbatches per rank)")
      ->check(cli::whole(1, INT64_MAX));
  app.add_option("--pipeline", opt.pipeline,
                 "stages per pipeline: mpirun -np R*P runs R replicas of a P-stage pipeline, each on a block of the "
                 "sequences (default: all ranks, one pipeline)")
      ->check(cli::whole(1, 1 << 20));
  app.add_option("--dtype", opt.dtype, "activation / compute dtype")
      ->capture_default_str()
      ->check(cli::one_of({"fp32", "bf16", "fp16"}));
  bool fp16 = false;
  app.add_flag("--fp16", fp16, "alias of --dtype fp16");
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
  app.add_option("--layers", opt.layers, "layers per rank, e.g. 6,6,6,6 (default: balanced by cost)");
  app.add_option("--threads", opt.threads, "CPU threads per rank (default: the node's cores / ranks on the node)")
      ->check(cli::whole(0, kMaxThreads));
  app.add_option("--timeout", opt.timeout_s,
                 "seconds any wait for another rank may take (MPI's start and end included) before the job aborts")
      ->capture_default_str()
      ->check(cli::seconds(kMaxTimeoutS));
  app.add_flag("--allow-nonfinite", opt.allow_nonfinite,
               "go on past NaN / Inf in the hidden states or logits, with a warning (for debugging)");
  auto* gen = app.add_option("--max-new-tokens", opt.max_new_tokens,
                             "generate this many tokens after each prompt (greedy unless --temperature)")
                  ->check(cli::whole(1, int64_t(1) << 30));
  app.add_option("--temperature", opt.temperature, "sampling temperature (0: greedy)")
      ->needs(gen)
      ->check(number_check("a finite number >= 0", [](double v) { return std::isfinite(v) && v >= 0; }));
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0: all)")
      ->needs(gen)
      ->check(cli::whole(0, int64_t(1) << 30));
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
      ->check(cli::one_of({"on", "off"}));
  std::string verify = "on";
  app.add_option("--verify-weights", verify,
                 "check every tensor against its digest as it is loaded (off: trusted files, e.g. just checked with "
                 "h5pack verify; the model fingerprints are compared either way)")
      ->capture_default_str()
      ->check(cli::one_of({"on", "off"}));
  app.footer(
      "Exit codes: 0 ran (and validated), 1 bad input or error (one line from the rank that found it),\n"
      "2 validation failed, 3 aborted (a rank failed after the exchange began, or a wait timed out),\n"
      "4 NaN/Inf found. Details: docs/pipeline.md");
  int parse_code = -1;  // -1: parsed; else the exit code after reporting
  std::string parse_error;
  try {
    app.parse(argc, argv);
    if (fp16 && app.count("--dtype") > 0 && opt.dtype != "fp16")
      parse_error = cat("--fp16 and --dtype ", opt.dtype, " disagree");
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      if (launched_as == 0) app.exit(e);  // --help
      parse_code = kExitOk;
    } else {
      parse_error = e.what();
    }
  }
  if (!parse_error.empty()) parse_code = kExitError;

  Watchdog watchdog(log_prefix(), launched_as);
  std::unique_ptr<MpiSession> mpi;
  WorldConfig world;
  watchdog.arm("MPI initialisation", opt.timeout_s);
  try {
    mpi = std::make_unique<MpiSession>(&argc, &argv);
    world = query_world();
  } catch (const std::exception& e) {
    log_error(e.what());
    return kExitError;
  }
  watchdog.disarm();
  set_log_prefix(cat("[rank ", world.rank, "] "));

  // Every rank knows the rank count and --pipeline alike, so a bad pair is found without talking.
  const int stages = opt.pipeline > 0 ? opt.pipeline : world.size;
  if (parse_code < 0 && world.size % stages != 0) {
    parse_code = kExitError;
    parse_error = cat("--pipeline ", stages, ": ", world.size, " ranks do not make whole pipelines of ", stages,
                      " stages (run a multiple of ", stages, " ranks: R replicas need R x ", stages, ")");
  }
  int code = parse_code;
  std::unique_ptr<Replicas> replicas;
  if (code < 0) {
    if (fp16) opt.dtype = "fp16";
    opt.cuda_graphs = graphs == "on";
    opt.verify_weights = verify == "on";
    opt.use_default = opt.model.empty() && opt.inputs.empty();
    try {
      watchdog.arm("grouping the ranks into replicas", opt.timeout_s);  // blocking collectives
      replicas = std::make_unique<Replicas>(world, stages);
      watchdog.disarm();
      code = run_rank(*replicas, opt);
    } catch (const std::exception& e) {
      abort_job(replicas ? replicas->world() : world, e);  // an agreement that timed out, an MPI error in one
    }
  } else if (code != kExitOk && world.rank == 0) {
    log_error(parse_error);  // every rank parsed the same line; rank 0 speaks for all of them
  }
  replicas.reset();  // its communicator goes before MPI does
  watchdog.arm("MPI_Finalize", opt.timeout_s);
  mpi.reset();
  watchdog.disarm();
  return code;
}
