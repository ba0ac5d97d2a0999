// Generation's state on the CPU (SPEC §3 "Generation"; model/step_batch.h): for each attention layer
// of the stage a K and a V pool of KV pages (paged_kv.h), one block table of the slots, for each conv
// layer the conv state of every slot, and the last stage's token choice (cpu_token_choice.h: the
// sampling defaults, the EOS id each slot's sequence ended with). Today's generation calls
// (alloc_state, prefill, decode, choose) run on it with sequence i in slot i, its positions one run
// of consecutive pages (old). The CUDA twin: model/cuda_decode_state.h.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kernels/sample.h"
#include "model/cpu_token_choice.h"
#include "model/layer_weights.h"
#include "model/step_batch.h"
#include "model/step_layout.h"

namespace lfm2 {

struct CpuDecodeState {
  // One layer's state of every slot.
  struct Layer {
    std::vector<float> k, v;  // attention: pools [n_pages, page_size, nkv, hd]
    std::vector<float> conv;  // conv: (n_slots, L - 1, H), u = B * x of the last positions
  };

  std::vector<Layer> layers;  // per layer of the stage
  StateShape shape;
  bool kv_fp8 = false;         // k and v rows stored as e4m3(x / s) * s (paged_kv.h; fp32 pools all the same)
  std::vector<int32_t> table;  // (n_slots, max_pages) page ids, -1: none
  CpuTokenChoice choice;       // the EOS state is the last stage's
  OldCalls old;                // today's calls: the prompt lengths per sequence (= slot)

  // Bytes of one page (every attention layer) and of one slot's other state.
  static int64_t page_bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, int64_t page_size);
  static int64_t slot_bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last);
  // The batch API's state, the block table empty; refuses (naming the bytes) what cannot be allocated.
  void allocate(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last,
                const StateShape& state_shape, const SamplingParams& sampling_params);
  // Today's (old_state_shape): slot i takes pages i * m .. i * m + m - 1; prompt_lengths (n_seq).
  void allocate_old(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last,
                    int64_t n_seq, int64_t max_positions, const int32_t* prompt_lengths,
                    const SamplingParams& sampling_params);
  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n);
  // Every entry's slot, rows and positions fit, and each position it writes or reads has a page.
  void check(const StepLayout& step) const;
};

}  // namespace lfm2
