// The CUDA pieces of lfm2-rank: GPU discovery, the NCCL transport and a busy timer on CUDA events.
//
// Declared without CUDA or NCCL headers so that run.cpp (plain C++) can use them; defined in
// gpu_info.cpp, transport_nccl.cpp and cuda_busy_timer.cpp, which are built only with the CUDA
// backend (the library lfm2_rank_cuda).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/cuda_stage.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/world.h"
#include "rank/transport/transport.h"

namespace lfm2 {

// GPUs this process can see (CUDA_VISIBLE_DEVICES applies); 0 when there is no driver or no GPU.
int visible_gpu_count();

struct GpuInfo {
  int device = -1;
  std::string name;        // "NVIDIA H200"
  unsigned char uuid[16];  // cudaDeviceProp::uuid: the same physical GPU has the same uuid in every process
  int64_t free_bytes = 0, total_bytes = 0;
  std::string uuid_string() const;  // "GPU-1a2b3c4d-..." as nvidia-smi prints it
};

// Properties and current free memory of `device` (makes it this thread's current device).
GpuInfo gpu_info(int device);

// Busy time of a CUDA stage: begin()/end() record events on the executor's compute stream around
// each step; busy_s() waits for the last one and sums the elapsed times. origin() is the event
// recorded at reset(), the zero of the run's GPU timeline.
class CudaBusyTimer : public BusyTimer {
 public:
  virtual CUevent_st* origin() const = 0;
};

std::unique_ptr<CudaBusyTimer> make_cuda_busy_timer(CudaStageExecutor& exec);

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
  // Transfer spans (--trace) are measured against this timer's origin (not owned).
  virtual void set_timeline(CudaBusyTimer* timer) = 0;
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
