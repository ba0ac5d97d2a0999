// The NCCL transport of the CUDA backend. Declared without CUDA or NCCL headers so that plain C++
// (start-up's make_backend) can use it; defined in nccl_transport.cpp, built only with the CUDA
// backend.
#pragma once

#include <functional>
#include <memory>

#include "model/cuda_stage.h"
#include "rank/mpi/world.h"
#include "rank/transport/transport.h"

namespace lfm2 {

// The NCCL transport: ncclSend / ncclRecv of device hidden-state buffers, ordered against the
// executor's compute stream by CUDA events. The link r -> r+1 has its own communicator (two, used
// alternately: link r on communicator r % 2), so a stage's sends and receives are on different
// communicators and streams and never queue behind each other; the feedback link from the last
// rank to rank 0 (generation's tokens) has a third. Constructing it allocates its
// streams, events and warm-up buffers but does not touch NCCL; connect() then creates the
// communicators and runs a warm-up exchange.
class NcclTransport : public Transport {
 public:
  // Rank 0 draws the unique ids, MPI broadcasts them; the communicators are created non-blocking
  // and polled against `timeout_s` (at least 60 s: creating one takes seconds); then every rank
  // sends a small message to the next and receives one from the previous, so that the first real
  // transfer does not pay for connection set-up. Sets NCCL_NVLS_ENABLE=0 unless the environment
  // already sets it. Throws (after ncclCommAbort) on error or timeout.
  virtual void connect() = 0;
  // Transfer spans (--trace) are measured from the event `origin()` returns: the zero of the run's
  // GPU timeline, recorded on the compute stream as each run starts (the busy timer's).
  virtual void set_timeline(std::function<CUevent_st*()> origin) = 0;
};

// SMs an NCCL kernel of the transport may take (ncclConfig_t.maxCTAs; NCCL_MAX_CTAS overrides), and
// the SMs a stage's GEMMs leave to the transfers that run beside them: a send and a receive at once.
// The same for every P (a single stage too), so that the GEMMs choose the same algorithms and a
// sequence's bits do not depend on P (costs a single stage ~3 % of its SMs).
inline constexpr int kNcclMaxCtas = 2;
inline constexpr int kNcclReservedSms = 2 * kNcclMaxCtas;

std::unique_ptr<NcclTransport> make_nccl_transport(const WorldConfig& world, CudaStageExecutor& exec,
                                                   double timeout_s);

}  // namespace lfm2
