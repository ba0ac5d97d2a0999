#include "model/cpu_decode_state.h"

#include <algorithm>
#include <new>
#include <numeric>

#include "common/error.h"

namespace lfm2 {

int64_t CpuDecodeState::page_bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights,
                                   int64_t page_size) {
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim();
  int64_t floats = 0;
  for (const LayerWeights& lw : layer_weights) floats += lw.is_attention ? 2 * page_size * kv : 0;
  return floats * int64_t(sizeof(float));
}

int64_t CpuDecodeState::slot_bytes(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights,
                                   bool is_last) {
  int64_t floats = 0;
  for (const LayerWeights& lw : layer_weights)
    floats += lw.is_attention ? 0 : (cfg.conv_L_cache - 1) * cfg.hidden_size;
  return floats * int64_t(sizeof(float)) + CpuTokenChoice::slot_bytes(is_last);
}

void CpuDecodeState::allocate(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights, bool is_last,
                              const StateShape& state_shape, const SamplingParams& sampling_params) {
  const StateShape& s = state_shape;
  LFM2_CHECK(s.n_slots >= 1 && s.n_pages >= 1 && s.max_pages >= 1, "cpu stage: a generation state of ", s.n_slots,
             " slots, ", s.n_pages, " pages, ", s.max_pages, " pages a slot");
  LFM2_CHECK(valid_page_size(s.page_size), "cpu stage: page size ", s.page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  const int64_t bytes = s.n_pages * page_bytes(cfg, layer_weights, s.page_size) +
                        s.n_slots * (slot_bytes(cfg, layer_weights, is_last) + s.max_pages * 4);
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache;
  try {
    layers.assign(layer_weights.size(), Layer{});
    for (size_t li = 0; li < layer_weights.size(); ++li) {
      Layer& st = layers[li];
      if (layer_weights[li].is_attention) {
        st.k.assign(size_t(s.n_pages * s.page_size * kv), 0.0f);
        st.v.assign(size_t(s.n_pages * s.page_size * kv), 0.0f);
      } else {
        st.conv.assign(size_t(s.n_slots * (L - 1) * cfg.hidden_size), 0.0f);
      }
    }
    table.assign(size_t(s.n_slots * s.max_pages), -1);
  } catch (const std::bad_alloc&) {
    layers.clear();
    LFM2_FAIL("cpu stage: the generation state (", s.n_slots, " slots, ", s.n_pages, " KV pages of ", s.page_size,
              " positions) needs ", bytes >> 20, " MiB, more than this host can allocate");
  }
  shape = s;
  choice.allocate(s.n_slots, sampling_params);
  old = OldCalls{{}, s.max_positions()};
}

void CpuDecodeState::allocate_old(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights,
                                  bool is_last, int64_t n_seq, int64_t max_positions, const int32_t* prompt_lengths,
                                  const SamplingParams& sampling_params) {
  const StateShape s = old_state_shape(n_seq, max_positions);
  allocate(cfg, layer_weights, is_last, s, sampling_params);
  std::iota(table.begin(), table.end(), 0);  // slot i: pages i * max_pages ..
  old = OldCalls{std::vector<int32_t>(prompt_lengths, prompt_lengths + n_seq), max_positions};
}

void CpuDecodeState::map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n) {
  LFM2_CHECK(!table.empty(), "cpu stage: map_pages() before alloc_batch_state()");
  check_map_pages(shape, slot, first, pages, n, "cpu stage");
  std::copy(pages, pages + n, table.begin() + slot * shape.max_pages + first);
}

void CpuDecodeState::check(const StepLayout& step) const {
  LFM2_CHECK(!table.empty(), "cpu stage: generation before its state is allocated");
  check_step_pages(step, shape, table.data(), "cpu stage");
}

}  // namespace lfm2
