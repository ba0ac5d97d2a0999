// The transport: moves one microbatch's hidden states from a stage to the next.
//
// The pipeline sees only raw bytes of a hidden-state buffer, non-blocking handles and waits that
// poll against a deadline, so that MPI (here: host buffers) and NCCL (the CUDA issue: device
// buffers, a communication stream) fit behind the same interface, and no rank ever waits forever on
// a peer that died or stalled: a wait past its timeout throws, and the caller aborts the job.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "rank/world.h"

namespace lfm2 {

class Transport {
 public:
  using Handle = int;  // one pending send or receive; kNone when there is none
  static constexpr Handle kNone = -1;

  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether buffers may live in device memory (NCCL) or must be host memory (MPI on the CPU).
  virtual bool accepts_device_memory() const = 0;

  // Start moving `bytes` bytes of `buf` to / from rank `peer`. Messages between one pair of ranks
  // arrive in the order they were sent; `tag` (>= 0) is checked where the transport can.
  virtual Handle isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Handle irecv(void* buf, size_t bytes, int peer, int tag) = 0;

  // True once the operation is complete (the handle is then released and must not be used again).
  virtual bool test(Handle h) = 0;
  // Polls test() until complete; past the timeout throws lfm2::Error naming `what` and the peer.
  virtual void wait(Handle h, const std::string& what) = 0;
  // Advances every pending operation without releasing any handle. The pipeline calls it while a
  // stage computes, so transfers that need both sides' attention (MPI's rendezvous protocol for
  // large messages) proceed during compute instead of at the next wait.
  virtual void progress() {}

  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

 protected:
  double timeout_s_ = 600;
};

// MPI point-to-point (MPI_Isend / MPI_Irecv / MPI_Test) on world.comm; host buffers only.
std::unique_ptr<Transport> make_mpi_transport(const WorldConfig& world, double timeout_s);

// Polls `done()` with a short spin and then sleeps growing to 1 ms, until it returns true or
// `timeout_s` passes (then returns false). Shared by the transports and the collective waits.
template <typename Done>
bool poll_until(Done&& done, double timeout_s);

// Waits for a non-blocking MPI collective (MPI_Iallreduce, ...) with a deadline; throws on timeout.
void wait_mpi_request(MPI_Request* req, double timeout_s, const std::string& what);

}  // namespace lfm2

#include "rank/poll.inl"
