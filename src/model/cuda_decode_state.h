// Generation's state on the GPU (SPEC §3 "Generation"; model/step_batch.h), in one device allocation
// (zeroed): for each attention layer of the stage a K and a V pool of KV pages (paged_kv.h, compute
// dtype; with kv_fp8 e4m3 pools and their fp32 scale pools instead), for each conv layer the conv state of every slot (fp32), the block table of the slots and
// the last stage's token choice (cuda_token_choice.h: the EOS state per slot, the emitted rows);
// beside them a step's descriptors (PagedSeq per entry, conv ends, slots to restart) at fixed device
// addresses, written in stream order from pinned staging before each step (so a decode step
// replays from a CUDA Graph), and the decode kernels' workspaces sized for every slot at once.
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
#include "model/cuda_token_choice.h"
#include "model/cuda_weights.h"
#include "model/step_batch.h"
#include "model/step_layout.h"

namespace lfm2 {

// A step's descriptors on the device (DecodeState's fixed buffers) and its host-side counts.
struct StepDevice {
  const PagedSeq* seqs = nullptr;  // (n_seqs), decode entries first
  const int32_t* ends = nullptr;   // (n_seqs) conv ends
  const int32_t* fresh = nullptr;  // (n_fresh) the slots that start a sequence
  int64_t n_seqs = 0, n_decode = 0, rows = 0, max_prompt_rows = 0, n_fresh = 0;
  const float* done = nullptr;     // (n_decode) finished flags of the decode rows, or null
};

template <typename T>
class DecodeState {
 public:
  // One layer's state of every slot.
  struct Layer {
    T *k = nullptr, *v = nullptr;  // attention: pools [n_pages, page_size, nkv, hd] (a T cache)
    float* conv = nullptr;         // conv: (n_slots, L - 1, H), u = B * x of the last positions
    uint8_t *k8 = nullptr, *v8 = nullptr;            // an fp8 cache: e4m3 [n_pages, page_size, nkv, hd]
    float *k_scale = nullptr, *v_scale = nullptr;    // and its scales [n_pages, page_size, nkv]
  };

  // kv_fp8: the KV cache in e4m3 with fp32 scales per (position, KV head) (--kv-dtype fp8).
  explicit DecodeState(bool kv_fp8 = false) : kv_fp8_(kv_fp8) {}
  bool kv_fp8() const { return kv_fp8_; }
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;
  ~DecodeState() { release(); }

  // Bytes of one page (every attention layer), of one slot's other state, and of a whole state.
  int64_t page_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                     int64_t page_size) const;
  int64_t slot_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers) const;
  int64_t bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                const StateShape& shape) const;

  // The batch API's state (block table empty); refuses before allocating, naming the bytes, a state
  // larger than the device's free memory. Synchronous.
  void allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, const StateShape& shape,
                const SamplingParams& sampling, int device);
  // Today's (old_state_shape): slot i on pages i * m .., prompt lengths (n_seq, host).
  void allocate_old(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                    int64_t max_len, const int32_t* lengths, const SamplingParams& sampling, int device);
  void release();
  bool allocated() const { return memory_.allocated(); }

  const StateShape& shape() const { return shape_; }
  const Layer& layer(size_t li) const { return layers_[li]; }
  const int32_t* table() const { return table_; }
  void* attention_workspace() const { return attn_ws_; }
  void* moe_scratch() const { return moe_ws_; }
  CudaTokenChoice& choice() { return choice_; }
  const CudaTokenChoice& choice() const { return choice_; }
  // Today's calls' sequences (their prompt lengths; none for the batch API's state).
  const OldCalls& old() const { return old_; }

  // Slot `slot`'s block-table entries [first, first + n) = pages (host), in stream order.
  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n, cudaStream_t stream);
  // Every entry's slot and positions fit, each position it touches has a page (the host's copy of
  // the table), and the step fits the descriptors.
  void check(const StepLayout& step) const;
  // Queues the step's descriptors into the fixed buffers; done: the decode rows' flags or null.
  StepDevice upload(const StepLayout& step, const float* done, cudaStream_t stream);

 private:
  struct Offsets {
    std::vector<int64_t> k, v, conv, ks, vs;  // per layer, -1 where the layer has none
    int64_t table = 0, step = 0, attn_ws = 0, moe_ws = 0;
    CudaTokenChoice::Blocks choice;
  };
  static constexpr int64_t kStepBytes = int64_t(sizeof(PagedSeq)) + 8;  // per slot: PagedSeq, end, fresh
  static Offsets plan(DeviceBlocks& blocks, const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                      const StateShape& shape, bool kv_fp8);
  // Refuses a state larger than the device's free memory (the blocks planned, not yet allocated).
  void check_fits(const StateShape& s, int device);
  // The blocks' addresses once allocated.
  void bind(const Offsets& o, size_t n_layers, int64_t n_slots);

  bool kv_fp8_ = false;
  DeviceBlocks memory_;
  StagingRing staging_;
  StateShape shape_;
  std::vector<Layer> layers_;  // per layer of the stage
  int32_t* table_ = nullptr;   // (n_slots, max_pages)
  PagedSeq* seqs_ = nullptr;   // the step's entries (n_slots at most), then ends_ and fresh_ (n_slots each)
  int32_t *ends_ = nullptr, *fresh_ = nullptr;
  void *attn_ws_ = nullptr, *moe_ws_ = nullptr;
  std::vector<char> host_desc_;  // a step's descriptors laid out as on the device
  std::vector<int32_t> host_table_;
  CudaTokenChoice choice_;  // last stage
  OldCalls old_;
};

}  // namespace lfm2
