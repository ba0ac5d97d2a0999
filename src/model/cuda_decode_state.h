// Generation's state on the GPU (SPEC §3 "Generation"; model/step_batch.h), in one device allocation
// (zeroed): for each attention layer of the stage a K and a V pool of KV pages (paged_kv.h, compute
// dtype), for each conv layer the conv state of every slot (fp32), the block table of the slots, the
// EOS id each slot's sequence ended with (last stage) and the EOS ids; beside them the step's
// descriptors (PagedSeq per entry, conv ends, slots to restart, the rows to choose from) at fixed
// device addresses, written in stream order from pinned staging before each step (so a decode step
// replays from a CUDA Graph), and the decode kernels' workspaces sized for every slot at once. The
// last stage's token choice: greedy on the device (argmax, then the EOS rule per slot), sampling on
// the host (cpu::choose_tokens on a pinned copy of the logits: the CPU's exact rule).
//
// Today's calls (alloc_state, prefill, decode, choose) run on it with sequence i in slot i on one
// run of pages (old_state_shape), as on the CPU (model/cpu_decode_state.h).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "io/model_config.h"
#include "kernels/paged_kv.h"
#include "kernels/sample.h"
#include "model/cuda_memory.h"
#include "model/cuda_weights.h"
#include "model/step_batch.h"
#include "model/step_layout.h"

namespace lfm2 {

// A step's descriptors on the device (DecodeState's fixed buffers) and its host-side counts.
struct StepDevice {
  const PagedSeq* seqs = nullptr;  // (n_seqs), decode entries first
  const int32_t* ends = nullptr;   // (n_seqs) conv ends
  int64_t n_seqs = 0, n_decode = 0, rows = 0, max_prompt_rows = 0;
  const float* done = nullptr;     // (n_decode) finished flags of the decode rows, or null
  int64_t prompt_rows() const { return rows - n_decode; }
};

template <typename T>
class DecodeState {
 public:
  // One layer's state of every slot.
  struct Layer {
    T *k = nullptr, *v = nullptr;  // attention: pools [n_pages, page_size, nkv, hd]
    float* conv = nullptr;         // conv: (n_slots, L - 1, H), u = B * x of the last positions
  };

  DecodeState() = default;
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;
  ~DecodeState() { release(); }

  // Bytes of one page (every attention layer), of one slot's other state, and of a whole state.
  static int64_t page_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                            int64_t page_size);
  static int64_t slot_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers);
  static int64_t bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                       const StateShape& shape);

  // The batch API's state (block table empty); refuses before allocating, naming the bytes, a state
  // larger than the device's free memory. Synchronous.
  void allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, const StateShape& shape,
                const SamplingParams& sampling, int device);
  // Today's (old_state_shape): slot i on pages i * m .., prompt lengths (n_seq, host).
  void allocate_old(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                    int64_t max_len, const int32_t* lengths, const SamplingParams& sampling, int device);
  // Where the last stage samples: pinned host memory for `rows` rows of logits.
  void set_host_logits(float* host_logits, int64_t rows) { host_logits_ = host_logits, host_logit_rows_ = rows; }
  void release();
  bool allocated() const { return memory_.allocated(); }

  const StateShape& shape() const { return shape_; }
  const Layer& layer(size_t li) const { return layers_[li]; }
  const int32_t* table() const { return table_; }
  void* attention_workspace() const { return attn_ws_; }
  void* moe_scratch() const { return moe_ws_; }
  const SamplingParams& sampling() const { return sampling_; }

  // Slot `slot`'s block-table entries [first, first + n) = pages (host), in stream order.
  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n, cudaStream_t stream);
  // Every entry's slot and positions fit, each position it touches has a page (the host's copy of
  // the table), and the step fits the descriptors.
  void check(const StepLayout& step) const;
  // Queues the step's descriptors into the fixed buffers; done: the decode rows' flags or null.
  StepDevice upload(const StepLayout& step, const float* done, cudaStream_t stream);
  // Last stage: restarts the EOS state of the step's fresh slots (uploaded by upload()).
  void restart(const StepLayout& step, cudaStream_t stream);
  // flags (n) = 1 where tokens (n, device) is an EOS id of the sampling (cuda::finished_flags).
  void finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const;

  // Queues the emitted rows' (row + 1) and slots into the fixed buffers; returns the rows' device
  // array for the head (rmsnorm_last with seq_len 0).
  const int32_t* upload_emits(const std::vector<StepEmit>& emits, cudaStream_t stream);
  // Token choice for emits [r0, r0 + rows) from their logits (rows, vocab) on the device. Greedy
  // (all of the step): argmax into top and margin, the EOS rule per slot into tokens + r0 (device),
  // copied to host + r0 (pinned, or null). Otherwise the logits go to the pinned copy.
  void choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows, bool greedy,
                   int64_t vocab, int32_t* top, float* margin, cudaStream_t stream);
  // Not greedy: waits for the logits, draws every emit with its sampling (params, one per emit, or
  // null for the defaults; cpu::choose_tokens keyed by (seed, seq, gen_step)), writes host and tokens.
  void choose_on_host(int32_t* tokens, int32_t* host, const std::vector<StepEmit>& emits, const SeqSampling* params,
                      int64_t vocab, cudaStream_t stream);
  // Whether a step's emits are all greedy.
  bool greedy(const std::vector<StepEmit>& emits, const SeqSampling* params) const;

  // Today's calls: sequences [first_seq, first_seq + n_seq) of seq_len positions fit the state; the
  // positions of decode step `step` (lengths[s] + step - 1), checked against max_len.
  void check_old(int64_t first_seq, int64_t n_seq, int64_t seq_len) const;
  std::vector<int64_t> decode_positions(int64_t first_seq, int64_t n_seq, int64_t step) const;
  const int32_t* host_lengths() const { return host_lengths_.data(); }

 private:
  struct Offsets {
    std::vector<int64_t> k, v, conv;  // per layer, -1 where the layer has none
    int64_t table = 0, ended = 0, eos = 0, step = 0, emits = 0;
    int64_t attn_ws = 0, moe_ws = 0;
  };
  static constexpr int64_t kStepBytes = int64_t(sizeof(PagedSeq)) + 8;  // per slot: PagedSeq, end, fresh
  static Offsets plan(DeviceBlocks& blocks, const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                      const StateShape& shape);

  DeviceBlocks memory_;
  StagingRing staging_;
  StateShape shape_;
  std::vector<Layer> layers_;  // per layer of the stage
  int32_t* table_ = nullptr;   // (n_slots, max_pages)
  int32_t* ended_ = nullptr;   // (n_slots) the EOS id each produced, -1 before
  int32_t* eos_ = nullptr;     // the EOS ids (at most 64)
  PagedSeq* seqs_ = nullptr;   // the step's entries (n_slots at most), then ends_ and fresh_ (n_slots each)
  int32_t *ends_ = nullptr, *fresh_ = nullptr;
  int32_t *emit_rows_ = nullptr, *emit_slots_ = nullptr;  // (n_slots) each, one block
  void *attn_ws_ = nullptr, *moe_ws_ = nullptr;
  std::vector<char> host_desc_;      // a step's descriptors (or emits) laid out as on the device
  std::vector<int32_t> host_table_;
  std::vector<int32_t> host_ended_;  // sampling: the EOS ids the host keeps, per slot
  SamplingParams sampling_;
  float* host_logits_ = nullptr;     // sampling: pinned (host_logit_rows_, V)
  int64_t host_logit_rows_ = 0;
  // today's calls
  std::vector<int32_t> host_lengths_;
  int64_t max_len_ = 0;
  int device_ = 0;
};

}  // namespace lfm2
