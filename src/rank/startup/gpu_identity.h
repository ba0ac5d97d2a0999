// Which physical GPU each rank uses, gathered over MPI before loading, so that two ranks mapped to
// one GPU (same UUID) stop the job with a clear error instead of sharing its memory and time.
// Plain data and MPI only: it compiles (and is tested) without CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include "rank/mpi/world.h"

namespace lfm2 {

struct GpuFacts {
  int64_t ok = 0, device = -1;  // ok: this rank found its GPU
  unsigned char uuid[16] = {};
  char host[64] = {}, name[64] = {}, uuid_text[48] = {};
};

// Every rank's facts, on every rank (a polled MPI_Iallgather: throws past timeout_s).
std::vector<GpuFacts> allgather_gpus(const WorldConfig& world, const GpuFacts& mine, double timeout_s);

// Throws naming both ranks, the GPU and the hosts if two ranks report the same UUID.
void check_distinct_gpus(const std::vector<GpuFacts>& all);

}  // namespace lfm2
