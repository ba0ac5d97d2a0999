#include "rank/startup/gpu_identity.h"

#include <cstring>

#include "common/error.h"
#include "rank/mpi/world.h"

namespace lfm2 {

std::vector<GpuFacts> allgather_gpus(const WorldConfig& world, const GpuFacts& mine, double timeout_s) {
  std::vector<GpuFacts> all(size_t(world.size));
  MPI_Request req;
  MPI_CHECK(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, world.comm, &req),
            "gathering the GPUs");
  wait_mpi_request(&req, timeout_s, "gathering the GPUs");
  return all;
}

void check_distinct_gpus(const std::vector<GpuFacts>& all) {
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j)
      if (all[i].ok && all[j].ok && std::memcmp(all[i].uuid, all[j].uuid, sizeof all[i].uuid) == 0)
        LFM2_FAIL("ranks ", i, " and ", j, " would share one GPU (", all[i].name, " ", all[i].uuid_text, ", device ",
                  all[i].device, " on ", all[i].host, " and device ", all[j].device, " on ", all[j].host,
                  "): give each rank its own GPU (CUDA_VISIBLE_DEVICES must not map two ranks to one)");
}

}  // namespace lfm2
