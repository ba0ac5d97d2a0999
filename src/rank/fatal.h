// Fatal-error handling of lfm2-rank, in two phases.
//
// Before the exchange: each rank runs its start-up steps, reports its own error in one line, and
// all ranks then agree (MPI_Allreduce) that every one is ready; if any is not, all exit nonzero
// before any hidden state moves. After the exchange has started a rank cannot know what the others
// are waiting for, so an error prints one line "[rank N] error: ..." and MPI_Abort ends every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rank/world.h"

namespace lfm2 {

// Exit codes of lfm2-rank (docs/pipeline.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;             // bad input, setup or run-time error
inline constexpr int kExitValidationFailed = 2;  // ran fine, answers did not match
inline constexpr int kExitAborted = 3;           // MPI_Abort after the exchange started

// Runs one start-up step; on lfm2::Error (or std::exception) logs "error: ..." when `report` and
// returns false. Errors every rank would find alike (the plan) are reported by rank 0 only.
bool startup_step(const std::function<void()>& step, bool report = true);

// Element-wise maximum over all ranks, waiting at most timeout_s (a non-blocking MPI_Iallreduce
// polled, so a dead rank cannot hang the others here).
std::vector<int64_t> allreduce_max(const WorldConfig& world, std::vector<int64_t> values, double timeout_s,
                                   const std::string& what);

// True when every rank's `ok` is true.
bool all_ready(const WorldConfig& world, bool ok, double timeout_s, const std::string& what);

// Logs "error: <msg>" and calls MPI_Abort(world.comm, kExitAborted); never returns.
[[noreturn]] void abort_job(const WorldConfig& world, const std::string& msg);

}  // namespace lfm2
