// Fatal-error handling of lfm2-rank, in two phases.
//
// Before the exchange: each rank runs its start-up steps and keeps its own error; all ranks then
// agree (MPI_Iallreduce, polled against --timeout) that every one is ready. If any is not, rank 0
// gathers the errors and prints each distinct one once, as "[rank N] error: ..." of the lowest rank
// that has it (naming the hosts when the ranks span several), and every rank exits 1 before any
// hidden state moves. After the exchange has started a rank cannot know what the others are waiting
// for, so an error prints one line and MPI_Abort ends every rank. A wait that times out (a peer
// stopped, or its link is down) does the same at any phase; the reporting rank first waits its
// stagger (0.25 s per place, at most 6 s: rank 0 waiting on all ranks first, naming those that did
// not arrive; then the blocked sender and receiver next to the stall), so that of several ranks
// left waiting one that names the stalled rank speaks and mpirun ends the others first.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "rank/mpi/world.h"

namespace lfm2 {

// Exit codes of lfm2-rank (docs/pipeline.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;             // bad input, setup or run-time error
inline constexpr int kExitValidationFailed = 2;  // ran fine, answers did not match
inline constexpr int kExitAborted = 3;           // MPI_Abort: a rank failed after the exchange began, or timed out
inline constexpr int kExitNonFinite = 4;         // NaN or Inf in the hidden states or logits (--allow-nonfinite)

// With replicas, a wait after the run that cannot name whom it waits for (the report, the exit
// agreement: collectives of the whole job) lasts this much longer than --timeout, so that a wait
// that can (a replica's results, the stage times: point to point) times out first and names the
// replica that stopped; 2.5 s is more than any rank's stagger.
inline constexpr double kUnnamedWaitGraceS = 2.5;
inline double unnamed_wait_s(const WorldConfig& world, double timeout_s) {
  return world.n_replicas > 1 ? timeout_s + kUnnamedWaitGraceS : timeout_s;
}

// Runs one start-up step; on lfm2::Error (or std::exception) keeps its message for the agreement's
// report when `report` and returns false. Errors every rank would find alike (the plan) are kept by
// rank 0 only. A TimeoutError goes on up: a wait that ran out leaves its collective pending, and no
// agreement can follow it.
bool startup_step(const std::function<void()>& step, bool report = true);

// Element-wise maximum over all ranks, waiting at most timeout_s (a non-blocking MPI_Iallreduce
// polled, so a dead rank cannot hang the others here).
std::vector<int64_t> allreduce_max(const WorldConfig& world, std::vector<int64_t> values, double timeout_s,
                                   const std::string& what);

// True when every rank's `ok` is true; otherwise the errors are reported (report_startup_errors).
bool all_ready(const WorldConfig& world, bool ok, double timeout_s, const std::string& what);

// After an agreement found a rank not ready: every rank's kept errors to rank 0, which prints each
// distinct message once, as the lowest rank that has it ("... (ranks 0-3)" when several do).
// Returns kExitError. Every rank must call it.
int report_startup_errors(const WorldConfig& world, double timeout_s);

// Logs "error: <msg>" and calls MPI_Abort on MPI_COMM_WORLD: the whole job ends. Never returns.
[[noreturn]] void abort_job(const WorldConfig& world, const std::string& msg, int code = kExitAborted);
// The same for an exception: a TimeoutError after the rank's stagger, a NonFiniteError with
// kExitNonFinite; with replicas any other error names this rank's replica ("error: replica 1: ...").
[[noreturn]] void abort_job(const WorldConfig& world, const std::exception& e);

}  // namespace lfm2
