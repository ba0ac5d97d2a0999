// Start-up at scale: how long from launch to the first microbatch, and how fast each rank read its
// weights (on GPUs: read and uploaded, the two overlapped), printed once by rank 0:
//
//   start-up: first microbatch 1.84 s after launch (the first rank's process start; the last rank
//   started 0.31 s after it: rank 2 on node-b); weights read at 0.62-0.75 GB/s per rank (slowest:
//   rank 2 on node-b, 41.7 MiB in 71 ms = 0.62 GB/s)
//
// "Launch" is the earliest process start of any rank (the kernel's record of it, on the wall
// clock), so across nodes the figure trusts their clocks to agree (NTP: to a few milliseconds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rank/mpi/world.h"

namespace lfm2 {

// One rank's start-up: its process start (wall clock, microseconds; -1 unknown), the time it spent
// loading its stage (microseconds: reading, and on GPUs the upload overlapped with it) and the
// bytes of weights it read.
struct StartupFacts {
  int64_t started_us = -1, load_us = 0, bytes_read = 0;
};

// This process's start on the wall clock (/proc/self/stat through CLOCK_BOOTTIME); -1 if unknown.
int64_t process_start_us();
// The wall clock now.
int64_t wall_now_us();

// The line above, from every rank's facts (by rank of `world`) and the wall-clock time at which the
// first microbatch entered the pipeline.
std::string startup_line(const WorldConfig& world, const std::vector<StartupFacts>& all, int64_t first_micro_us);

// "41.7 MiB in 71 ms = 0.62 GB/s" (GiB from 1 GiB on): one rank's read.
std::string read_rate(int64_t bytes, int64_t us);

}  // namespace lfm2
