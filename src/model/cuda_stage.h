// The CUDA StageExecutor: one pipeline stage on one GPU (SPEC §1 with the kernels of
// src/kernels/cuda/ops.h). Declared without CUDA headers so that CPU-only code can include it:
// the stream and event types are the CUDA driver's opaque structs, forward-declared
// (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*).
//
// Weights are converted to the compute dtype (matrices; norms, biases and conv taps stay fp32) and
// uploaded once into one device allocation; q/k/v and w1/w3 are stacked so that each is one GEMM.
// Hidden states (act_dtype) are the fp32 residual stream. All scratch is allocated by
// alloc_hidden() for the largest max_tokens asked for, before the first exchange; forward() and
// head() never allocate and never synchronise the host (head() copies its results into pinned
// memory from alloc_host(), asynchronously). Out-of-memory names what was being allocated and the
// free memory.
#pragma once

#include <memory>

#include "common/dtype.h"
#include "model/stage_executor.h"

struct CUstream_st;
struct CUevent_st;

namespace lfm2 {

class CudaStageExecutor : public StageExecutor {
 public:
  // The device this stage runs on, and its compute stream: every method queues its work on it, so a
  // transport orders against it with events (cudaEventRecord / cudaStreamWaitEvent on stream()).
  virtual int device() const = 0;
  virtual CUstream_st* stream() const = 0;
  virtual DType compute_dtype() const = 0;
  // Makes the compute stream wait for `event` (recorded on another stream, e.g. a receive).
  virtual void wait_event(CUevent_st* event) = 0;
  // Records `event` on the compute stream after the work queued so far.
  virtual void record_event(CUevent_st* event) = 0;
};

// compute_dtype: F32 (exact fp32 GEMMs unless tf32), BF16 or F16 (tensor cores, fp32 accumulation,
// fp32 norms, softmax and residual). Reads the stage's datasets through load_model_weights().
// graphs: forward() replays a CUDA Graph captured once per hidden buffer and shape (off: launches
// every kernel each time; also off under LFM2_SYNC_CHECK, which synchronises after each launch).
// reserved_sms: SMs the GEMMs leave to kernels running beside them (a pipeline's NCCL transfers).
// kv_fp8: generation's KV cache in e4m3 with fp32 scales (--kv-dtype fp8; bf16 / fp16 only).
std::unique_ptr<CudaStageExecutor> make_cuda_stage(WeightReader& weights, const StageLayers& stage,
                                                   DType compute_dtype, int device, bool tf32 = false,
                                                   bool graphs = true, int reserved_sms = 0, bool kv_fp8 = false);

}  // namespace lfm2
