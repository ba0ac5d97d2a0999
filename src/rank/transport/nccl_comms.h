// The NCCL communicators of one replica's links, for the NCCL transport (nccl_transport.cpp; built
// only with the CUDA backend): link r -> r+1 on communicator r % 2, so that a stage's send and its
// receive are on different communicators, and the feedback link P-1 -> 0 (generation's tokens) on a
// third. Created non-blocking and polled with a deadline; finalized cleanly at the end, or aborted on
// any error (ncclCommAbort: nothing of them can hang any more) before lfm2::Error is thrown.
#pragma once

#include <nccl.h>

#include <array>
#include <string>

#include "rank/mpi/world.h"

namespace lfm2 {

class NcclComms {
 public:
  NcclComms(const WorldConfig& world, int device) : world_(world), device_(device) {}

  // Rank 0 draws the unique ids, MPI broadcasts them (within timeout_s); each communicator is
  // created with at most max_ctas CTAs per kernel (NCCL_MAX_CTAS overrides) within init_s.
  void create(int max_ctas, double timeout_s, double init_s);
  bool created() const { return comms_[kFeedback] != nullptr; }

  ncclComm_t send() const { return comms_[size_t(world_.rank % kLinks)]; }  // to the next rank
  ncclComm_t recv() const { return comms_[size_t((world_.rank + kLinks - 1) % kLinks)]; }  // from the previous
  ncclComm_t feedback() const { return comms_[kFeedback]; }  // last rank -> rank 0

  // An NCCL call's own return code: in progress is fine (settle() follows), anything else fails.
  void check_call(ncclComm_t comm, ncclResult_t rc, const std::string& what);
  // Any communicator's asynchronous error fails, naming `what`.
  void check_async(const std::string& what);
  // A non-blocking communicator may still be working on the last call; waits (with the deadline)
  // until it has taken it, as NCCL requires before the next call.
  void settle(ncclComm_t comm, const std::string& what, double timeout_s);

  // A clean end: finalize flushes NCCL's own work, then destroy; one that does not finish is aborted.
  void finalize();
  // Aborts every communicator (so that no NCCL kernel or proxy waits on a peer any more).
  void abort();
  // abort(), then throws lfm2::Error with msg.
  [[noreturn]] void fail(const std::string& msg);

 private:
  static constexpr int kLinks = 2, kFeedback = 2;
  static ncclResult_t state(ncclComm_t comm);

  WorldConfig world_;
  int device_;
  std::array<ncclComm_t, kLinks + 1> comms_{};  // forward links by parity, then the feedback link
};

}  // namespace lfm2
