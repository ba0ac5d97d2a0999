// This rank's backend: the CPU reference or CUDA, chosen once for the whole job. The only part of
// lfm2-rank that is built differently with and without the CUDA backend (LFM2_HAVE_CUDA); the
// start-up phases (phases.h) ask it and never look at the build themselves.
//
// CPU: the reference executor, the MPI transport, busy time measured on the host.
// CUDA: node-local rank r takes device r of those it sees, the CUDA executor (with the SMs the
// transfers take left free), the NCCL transport on the replica's communicators (connected in a
// phase of its own, after every buffer), busy time and spans from CUDA events.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/dtype.h"
#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "plan/layer_partition.h"
#include "rank/engine/busy_timer.h"
#include "rank/mpi/world.h"
#include "rank/options.h"
#include "rank/startup/gpu_identity.h"
#include "rank/transport/transport.h"

namespace lfm2 {

// --device, --dtype and --tf32 against what this build has (every rank checks; rank 0 reports).
void check_backend_options(const RankOptions& opt);
// --device auto found no GPU on some rank: the job runs on the CPU, which has no bf16 and no TF32.
void check_cpu_fallback(const RankOptions& opt);
// Whether this rank could run on a GPU: it sees one, --device is not cpu, the build has CUDA.
bool sees_gpu(const RankOptions& opt);
// This rank's GPU (node-local rank r takes device r); throws where it has none of its own.
GpuFacts this_gpu(const WorldConfig& world);

struct Backend {
  std::unique_ptr<StageExecutor> exec;   // this stage's layers
  std::unique_ptr<Transport> transport;  // to the neighbouring stages of this rank's replica
  std::unique_ptr<BusyTimer> timer;      // device executors: busy time on the device's own clock
  int64_t load_us = 0;                   // making the executor: reading (and uploading) its weights
  std::function<void()> connect;         // NCCL: the communicators and their warm-up; empty: none
};

// Loads this rank's stage (`stage` of the replica `pipe`) from `weights` on the CPU (n_threads
// workers) or the GPU (dtype), and makes the transport of its replica.
Backend make_backend(const RankOptions& opt, const WorldConfig& pipe, const StageLayers& stage, WeightReader& weights,
                     bool use_cuda, DType dtype, int n_threads);

// The GPU's memory now (after every allocation: the plan prints it); device -1 on the CPU.
struct GpuMemory {
  int64_t device = -1, weight_bytes = 0, free_bytes = 0, total_bytes = 0;
};
GpuMemory gpu_memory(const Backend& backend);

// The GPU's copy bandwidth, bytes/s (gpu_info.h); 0 on the CPU.
double device_copy_bandwidth(const Backend& backend);

}  // namespace lfm2
