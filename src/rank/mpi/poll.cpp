#include "rank/mpi/poll.h"

#include "common/error.h"
#include "rank/mpi/world.h"

namespace lfm2 {

void wait_mpi_request(MPI_Request* req, double timeout_s, const std::string& what) {
  auto done = [&] {
    int flag = 0;
    MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE), what);
    return flag != 0;
  };
  if (!poll_until(done, timeout_s))
    LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s in ", what, " (a rank stopped? see --timeout)");
}

}  // namespace lfm2
