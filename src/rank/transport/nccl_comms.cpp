#include "rank/transport/nccl_comms.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/error.h"

namespace lfm2 {

ncclResult_t NcclComms::state(ncclComm_t comm) {
  ncclResult_t st = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
  return rc == ncclSuccess ? st : rc;
}

void NcclComms::create(int max_ctas, double timeout_s, double init_s) {
  // The forward links' communicators (one for P = 2), then the feedback link's.
  std::vector<int> wanted;
  for (int c = 0; c < std::min(kLinks, world_.size - 1); ++c) wanted.push_back(c);
  wanted.push_back(kFeedback);
  std::array<ncclUniqueId, kLinks + 1> ids{};
  if (world_.is_first())
    for (int c : wanted) NCCL_CHECK(ncclGetUniqueId(&ids[size_t(c)]));
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(ids.data(), int(sizeof ids), MPI_BYTE, 0, world_.comm, &req), "broadcasting the NCCL unique ids");
  wait_mpi_request(&req, timeout_s, "broadcasting the NCCL unique ids");

  for (int c : wanted) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and every call return at once; we poll with a deadline instead
    if (!std::getenv("NCCL_MAX_CTAS")) {
      config.minCTAs = 1;
      config.maxCTAs = max_ctas;
    }
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, world_.size, ids[size_t(c)], world_.rank, &config);
    comms_[size_t(c)] = comm;
    if (rc != ncclSuccess && rc != ncclInProgress)
      fail(cat("nccl: creating communicator ", c, " of ", world_.size, " ranks on GPU ", device_,
               " failed: ", ncclGetErrorString(rc)));
    settle(comm, cat("creating NCCL communicator ", c, " of ", world_.size, " ranks on GPU ", device_), init_s);
  }
}

void NcclComms::check_call(ncclComm_t comm, ncclResult_t rc, const std::string& what) {
  if (rc != ncclSuccess && rc != ncclInProgress)
    fail(cat("nccl: ", what, ": ", ncclGetErrorString(rc), " (", ncclGetLastError(comm), ")"));
}

void NcclComms::check_async(const std::string& what) {
  for (ncclComm_t comm : comms_) {
    if (!comm) continue;
    const ncclResult_t st = state(comm);
    if (st != ncclSuccess && st != ncclInProgress)
      fail(cat("nccl: ", what, ": ", ncclGetErrorString(st), " (", ncclGetLastError(comm), ")"));
  }
}

void NcclComms::settle(ncclComm_t comm, const std::string& what, double timeout_s) {
  bool failed = false;
  const bool done = poll_until(
      [&] {
        const ncclResult_t st = state(comm);
        failed = st != ncclSuccess && st != ncclInProgress;
        return st != ncclInProgress;
      },
      timeout_s);
  if (failed) check_async(what);
  if (!done) fail(cat("timed out after ", timeout_s, " s in ", what, " (did a rank stop? see --timeout)"));
}

void NcclComms::finalize() {
  for (ncclComm_t& comm : comms_) {
    if (!comm) continue;
    const ncclResult_t rc = ncclCommFinalize(comm);
    const bool clean = (rc == ncclSuccess || rc == ncclInProgress) &&
                       poll_until([&] { return state(comm) != ncclInProgress; }, 30) && state(comm) == ncclSuccess;
    if (clean)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
    comm = nullptr;
  }
}

void NcclComms::abort() {
  for (ncclComm_t& comm : comms_) {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
}

void NcclComms::fail(const std::string& msg) {
  abort();
  LFM2_FAIL(msg);
}

}  // namespace lfm2
