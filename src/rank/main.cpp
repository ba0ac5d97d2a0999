// lfm2-rank: LFM2-MoE inference as a pipeline over MPI ranks (one stage per rank), or as R replicas
// of a P-stage pipeline (--pipeline P over R x P ranks).
//
//   mpirun -np 4 lfm2-rank --model model.h5 --inputs inputs.h5 --answers answers.h5 --output out.h5
//   mpirun -np 4 lfm2-rank --pipeline 2 ...     # two replicas of a 2-stage pipeline
//
// With no arguments it runs and validates the shipped default under data/default (docs/pipeline.md).
#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "common/pending_file.h"
#include "io/h5_util.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/fault_hook.h"
#include "rank/mpi/replica_comms.h"
#include "rank/mpi/watchdog.h"
#include "rank/mpi/world.h"
#include "rank/options.h"

int main(int argc, char** argv) {
  using namespace lfm2;
  h5_no_exit_handlers();
  // Until MPI says otherwise, the launcher's environment tells this process its rank.
  const int launched_as = launcher_rank();
  set_log_prefix(cat("[rank ", launched_as, "] "));
  remove_pending_files_on_signals();  // an interrupted job leaves no OUT.h5.tmp.* behind
  fault_point(launched_as, "init");

  // The command line is parsed before MPI starts, so that --timeout bounds MPI's start as well.
  ParsedOptions parsed = parse_options(argc, argv, launched_as == 0);
  RankOptions& opt = parsed.opt;
  int parse_code = parsed.code;
  std::string parse_error = parsed.error;
  try {
    set_log_level(opt.log_level >= 0 ? LogLevel(opt.log_level) : log_level_from_env(LogLevel::kNormal));
  } catch (const std::exception& e) {
    if (parse_code < 0) parse_code = kExitError, parse_error = e.what();
  }
  set_info_to_stderr(opt.stream);  // stdout carries the token events alone

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
