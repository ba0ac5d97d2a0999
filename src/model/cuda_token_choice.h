// The last stage's token choice on the GPU (SPEC §3 "Generation"; the CPU twin: cpu_token_choice.h):
// per slot the EOS id its sequence ended with (-1 before), the EOS ids, and the emitted rows with
// their slots at fixed device addresses (written from pinned staging before the head). Greedy on the
// device (argmax, then the EOS rule per slot), sampling on the host (choose_emitted on a pinned copy
// of the logits, against the device's EOS state, read and written back: the CPU's exact rule). Its
// blocks are reserved in the generation state's one allocation (cuda_decode_state.h); the first
// stage asks it only for the finished flags of fed-back tokens.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/sample.h"
#include "model/cuda_memory.h"
#include "model/step_batch.h"
#include "model/step_layout.h"

namespace lfm2 {

class CudaTokenChoice {
 public:
  static constexpr int64_t kMaxEos = 64;  // EOS ids the device keeps
  struct Blocks {
    int64_t ended = 0, eos = 0, emits = 0;  // offsets in the state's allocation
  };

  CudaTokenChoice() = default;
  CudaTokenChoice(const CudaTokenChoice&) = delete;
  CudaTokenChoice& operator=(const CudaTokenChoice&) = delete;
  ~CudaTokenChoice();

  // Reserves its blocks for n_slots slots.
  static Blocks reserve(DeviceBlocks& blocks, int64_t n_slots);
  // Takes its blocks of the allocated `memory`: no slot has ended, the EOS ids of `sampling` copied
  // (on the legacy stream: the caller synchronises). Emits are copied through `staging`.
  void bind(const DeviceBlocks& memory, const Blocks& blocks, int64_t n_slots, const SamplingParams& sampling,
            StagingRing* staging);
  // Forgets the blocks (the pinned logits stay for the next state).
  void release();
  // Lets the host sample up to `rows` rows of `vocab` logits in this state: pinned memory for them,
  // grown to the most rows asked for.
  void allow_sampling(int64_t rows, int64_t vocab, int device);

  const SamplingParams& sampling() const { return sampling_; }
  // flags (n) = 1 where tokens (n, device) is an EOS id of the sampling (cuda::finished_flags).
  void finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const;
  // Last stage: the slots (n, device: a step's descriptors) start new sequences.
  void restart(const int32_t* slots, int64_t n, cudaStream_t stream);

  // Queues the emitted rows' (row + 1) and slots into the fixed buffers; returns the rows' device
  // array for the head (rmsnorm_last with seq_len 0).
  const int32_t* upload_emits(const std::vector<StepEmit>& emits, cudaStream_t stream);
  // Whether a step's emits are all greedy (params: one per emit, or null for the defaults).
  bool greedy(const std::vector<StepEmit>& emits, const SeqSampling* params) const;
  // Token choice for emits [r0, r0 + rows) from their logits (rows, vocab) on the device. Greedy
  // (all of the step): argmax into top and margin, the EOS rule per slot into tokens + r0 (device),
  // copied to host + r0 (pinned, or null). Otherwise the logits go to the pinned copy.
  void choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows, bool greedy,
                   int64_t vocab, int32_t* top, float* margin, cudaStream_t stream);
  // Not greedy: waits for the logits, draws every emit with its sampling (params, one per emit, or
  // null for the defaults; choose_emitted keyed by (seed, seq, gen_step)), writes host and tokens.
  void choose_on_host(int32_t* tokens, int32_t* host, const std::vector<StepEmit>& emits, const SeqSampling* params,
                      int64_t vocab, cudaStream_t stream);

 private:
  int64_t n_slots_ = 0;
  SamplingParams sampling_;
  StagingRing* staging_ = nullptr;
  int32_t* ended_ = nullptr;                              // (n_slots) the EOS id each produced, -1 before
  int32_t* eos_ = nullptr;                                // the EOS ids (at most kMaxEos)
  int32_t *emit_rows_ = nullptr, *emit_slots_ = nullptr;  // (n_slots) each, one block
  std::vector<int32_t> host_emits_;                       // [rows][slots] as on the device
  std::vector<int32_t> host_ended_;                       // sampling: the EOS ids the host keeps, per slot
  float* host_logits_ = nullptr;                          // sampling: pinned (host_logit_capacity_, V)
  int64_t host_logit_capacity_ = 0;                       // rows of host_logits_
  int64_t host_logit_rows_ = 0;                           // rows this state may sample (0: none)
};

}  // namespace lfm2
