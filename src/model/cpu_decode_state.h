// Generation's state on the CPU (SPEC §3 "Generation"): for each layer of the stage the KV cache
// (attention layers) or the conv state (conv layers) of every sequence, the prompt lengths, how
// the last stage chooses tokens and the EOS id each sequence ended with. The CUDA twin:
// model/cuda_decode_state.h.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kernels/sample.h"
#include "model/layer_weights.h"

namespace lfm2 {

struct CpuDecodeState {
  // One layer's state of every sequence.
  struct Layer {
    std::vector<float> k, v;  // attention: (N, max_len, nkv * hd)
    std::vector<float> conv;  // conv: (N, L - 1, H), u = B * x of the last positions
  };

  std::vector<Layer> layers;  // per layer of the stage
  int64_t max_len = 0;
  std::vector<int32_t> lengths;  // (N) prompt lengths
  SamplingParams sampling;
  std::vector<int32_t> ended;  // last stage: per sequence, the EOS id it produced (cpu::kNotEnded: none yet)

  // Bytes allocate() takes for n_seq sequences of at most max_len positions.
  static int64_t bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last,
                       int64_t n_seq, int64_t max_len);
  // For n_seq sequences of at most max_positions positions; prompt_lengths (n_seq).
  void allocate(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, int64_t n_seq,
                int64_t max_positions, const int32_t* prompt_lengths, const SamplingParams& sampling_params);
  // Sequences [first_seq, first_seq + n_seq) of seq_len positions fit the state.
  void check(int64_t first_seq, int64_t n_seq, int64_t seq_len) const;
  // The positions of their decode step `step` (lengths[s] + step - 1), checked against max_len.
  std::vector<int64_t> decode_positions(int64_t first_seq, int64_t n_seq, int64_t step) const;
  // After a prefill: the sequences have not ended.
  void restart(int64_t first_seq, int64_t n_seq);
};

}  // namespace lfm2
