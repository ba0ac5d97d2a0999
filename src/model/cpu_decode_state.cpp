#include "model/cpu_decode_state.h"

#include <algorithm>

#include "common/error.h"

namespace lfm2 {

int64_t CpuDecodeState::bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last,
                              int64_t n_seq, int64_t max_len) {
  int64_t floats = 0;
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache;
  for (const LayerWeights& lw : layer_weights)
    floats += lw.is_attention ? 2 * n_seq * max_len * kv : n_seq * (L - 1) * cfg.hidden_size;
  return floats * int64_t(sizeof(float)) + (is_last ? n_seq : 0);
}

void CpuDecodeState::allocate(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, int64_t n_seq,
                              int64_t max_positions, const int32_t* prompt_lengths,
                              const SamplingParams& sampling_params) {
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache;
  layers.assign(layer_weights.size(), Layer{});
  for (size_t li = 0; li < layer_weights.size(); ++li) {
    Layer& st = layers[li];
    if (layer_weights[li].is_attention) {
      st.k.assign(size_t(n_seq * max_positions * kv), 0.0f);
      st.v.assign(size_t(n_seq * max_positions * kv), 0.0f);
    } else {
      st.conv.assign(size_t(n_seq * (L - 1) * cfg.hidden_size), 0.0f);
    }
  }
  max_len = max_positions;
  lengths.assign(prompt_lengths, prompt_lengths + n_seq);
  sampling = sampling_params;
  ended.assign(size_t(n_seq), cpu::kNotEnded);
}

void CpuDecodeState::check(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
  LFM2_CHECK(!lengths.empty(), "cpu stage: generation before alloc_state()");
  LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= int64_t(lengths.size()) && seq_len <= max_len,
             "cpu stage: sequences [", first_seq, ", ", first_seq + n_seq, ") of ", seq_len,
             " tokens outside the state of ", lengths.size(), " x ", max_len);
}

std::vector<int64_t> CpuDecodeState::decode_positions(int64_t first_seq, int64_t n_seq, int64_t step) const {
  check(first_seq, n_seq, 1);
  std::vector<int64_t> pos(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) pos[size_t(i)] = lengths[size_t(first_seq + i)] + step - 1;
  LFM2_CHECK(pos.empty() || *std::max_element(pos.begin(), pos.end()) < max_len, "cpu stage: decode step ", step,
             " reaches past the state's ", max_len, " positions");
  return pos;
}

void CpuDecodeState::restart(int64_t first_seq, int64_t n_seq) {
  std::fill(ended.begin() + first_seq, ended.begin() + first_seq + n_seq, cpu::kNotEnded);
}

}  // namespace lfm2
