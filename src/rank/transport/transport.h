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
#include <vector>

#include "rank/mpi/world.h"
#include "rank/transport/trace_span.h"

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
  // arrive in the order they were sent; `tag` (>= 0) is checked where the transport can. A device
  // transport starts a send once the compute queued so far is done (it wrote buf), and a receive
  // once that compute (the last reader of buf) and the send `after` (an earlier send out of the
  // same buffer, still pending; kNone for none) are done, all ordered on the device. A host
  // transport starts at once; `after` must then be kNone (the caller waits for that send first).
  virtual Handle isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Handle irecv(void* buf, size_t bytes, int peer, int tag, Handle after) = 0;

  // Device transports: the compute queued on the executor from now on waits, on the device, for
  // operation h (a receive's data to arrive, or a send to have read its buffer). Returns at once;
  // h stays pending until test() or wait() releases it. Host transports cannot (they wait instead).
  virtual void order_compute_after(Handle h);

  // True once the operation is complete (the handle is then released and must not be used again).
  virtual bool test(Handle h) = 0;
  // Polls test() until complete; past the timeout throws lfm2::Error naming `what` and the peer.
  virtual void wait(Handle h, const std::string& what) = 0;
  // Advances every pending operation without releasing any handle. The pipeline calls it while a
  // stage computes, so transfers that need both sides' attention (MPI's rendezvous protocol for
  // large messages) proceed during compute instead of at the next wait.
  virtual void progress() {}

  // Timeline (--trace): record when each transfer ran; transfer_spans() then returns the spans of
  // the transfers completed since the last call (device transports; host ones return none, the
  // pipeline times them itself).
  virtual void set_tracing(bool on) { (void)on; }
  virtual std::vector<TraceSpan> transfer_spans() { return {}; }

  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

 protected:
  double timeout_s_ = 600;
};

// MPI point-to-point (MPI_Isend / MPI_Irecv / MPI_Test) on world.comm; host buffers only.
std::unique_ptr<Transport> make_mpi_transport(const WorldConfig& world, double timeout_s);

}  // namespace lfm2
