// The backend interface: one pipeline stage's compute, on the CPU (the oracle) or on a GPU.
//
// The pipeline (src/rank) owns the schedule and the transport; an executor owns its stage's
// weights and scratch memory and runs the math of SPEC §1 on a microbatch of n_seq sequences of
// seq_len tokens each (positions 0..seq_len-1, rows ordered sequence-major: row = s*seq_len + t).
// Hidden states are opaque buffers of n_seq*seq_len*hidden elements of act_dtype(), living where
// the backend computes (host memory for the CPU, device memory for CUDA).
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "io/weight_file.h"

namespace lfm2 {

struct StageRange {
  int layer_begin = 0, layer_end = 0;  // [begin, end)
  bool is_first = true, is_last = true;
};

// Where head() leaves its results: host memory from alloc_host(), readable once the executor's
// queued work is done (synchronize()). Null pointers are not wanted and cost nothing.
struct HeadOutputs {
  int32_t* next_token = nullptr;  // (n_seq) top-1 of each sequence's last position (first maximum)
  float* margin = nullptr;        // (n_seq) its logit minus the runner-up's (0 on a tie)
  float* logits = nullptr;        // (n_seq, V) last position
  float* all_logits = nullptr;    // (n_seq * seq_len, V) every position
};

class StageExecutor {
 public:
  virtual ~StageExecutor() = default;

  virtual DType act_dtype() const = 0;       // element type of hidden-state buffers
  virtual bool on_device() const = 0;        // buffers live in GPU memory
  virtual int64_t weight_bytes() const = 0;  // bytes of weights this stage holds

  // A hidden-state buffer for up to max_tokens tokens, owned by the executor. Allocate every
  // buffer before the first exchange.
  virtual void* alloc_hidden(int64_t max_tokens) = 0;
  // Host memory of `bytes` bytes that queued work may read and write asynchronously (pinned on a
  // GPU), owned by the executor.
  virtual void* alloc_host(int64_t bytes) = 0;

  // First stage: x = embed_tokens[ids]; ids (host memory from alloc_host) is [n_seq, seq_len],
  // already range-checked, and must stay unchanged until the queued work is done.
  virtual void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) = 0;
  // This stage's layers, in place on x.
  virtual void forward(void* x, int64_t n_seq, int64_t seq_len) = 0;
  // Last stage: final norm, LM head and the top-1 with its margin, into `out` (see HeadOutputs).
  // next_token and margin are always computed; the logits cross to the host only where asked.
  virtual void head(const void* x, int64_t n_seq, int64_t seq_len, const HeadOutputs& out) = 0;
  // Blocks until queued work is done (a no-op on the CPU).
  virtual void synchronize() = 0;

  // Device executors: queues a count of the NaN / +-Inf values among the first n fp32 elements of a
  // buffer in its memory (a hidden-state buffer) into *count, host memory from alloc_host() that
  // the caller zeroed; readable once the queued work is done (synchronize()). Returns false where
  // the backend has no such kernel (then nothing is queued, and model/checked_stage.h checks only
  // the head's host outputs). Host executors need not implement it: their buffers are read directly.
  virtual bool count_nonfinite(const void* buf, int64_t n, uint32_t* count) {
    (void)buf, (void)n, (void)count;
    return false;
  }
};

// The CPU reference executor: fp32 weights and activations, fp32 accumulation, n_threads workers
// (0: hardware concurrency). Reads only the datasets of its range from `weights`.
std::unique_ptr<StageExecutor> make_cpu_stage(WeightReader& weights, const StageRange& range, int n_threads = 0);

}  // namespace lfm2
