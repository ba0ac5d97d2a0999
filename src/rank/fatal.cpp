#include "rank/fatal.h"

#include <cstdlib>

#include "common/error.h"
#include "common/log.h"
#include "rank/transport.h"

namespace lfm2 {

bool startup_step(const std::function<void()>& step, bool report) {
  try {
    step();
    return true;
  } catch (const std::exception& e) {
    if (report) log_error(e.what());
    return false;
  }
}

std::vector<int64_t> allreduce_max(const WorldConfig& world, std::vector<int64_t> values, double timeout_s,
                                   const std::string& what) {
  std::vector<int64_t> out(values.size());
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(values.data(), out.data(), int(values.size()), MPI_INT64_T, MPI_MAX, world.comm, &req),
            what);
  wait_mpi_request(&req, timeout_s, what);
  return out;
}

bool all_ready(const WorldConfig& world, bool ok, double timeout_s, const std::string& what) {
  return allreduce_max(world, {ok ? 0 : 1}, timeout_s, what)[0] == 0;
}

void abort_job(const WorldConfig& world, const std::string& msg) {
  log_error(msg);
  MPI_Abort(world.comm, kExitAborted);
  std::_Exit(kExitAborted);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace lfm2
