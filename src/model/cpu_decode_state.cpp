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
  return floats * int64_t(sizeof(float)) + (is_last ? int64_t(sizeof(int32_t)) : 0);
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
  sampling = sampling_params;
  ended.assign(size_t(s.n_slots), cpu::kNotEnded);
  lengths.clear();
  max_len = s.max_positions();
}

void CpuDecodeState::allocate_old(const ModelConfig& cfg, const std::vector<LayerWeights>& layer_weights,
                                  bool is_last, int64_t n_seq, int64_t max_positions, const int32_t* prompt_lengths,
                                  const SamplingParams& sampling_params) {
  const StateShape s = old_state_shape(n_seq, max_positions);
  allocate(cfg, layer_weights, is_last, s, sampling_params);
  std::iota(table.begin(), table.end(), 0);  // slot i: pages i * max_pages ..
  lengths.assign(prompt_lengths, prompt_lengths + n_seq);
  max_len = max_positions;
}

void CpuDecodeState::map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n) {
  LFM2_CHECK(!table.empty(), "cpu stage: map_pages() before alloc_batch_state()");
  LFM2_CHECK(slot >= 0 && slot < shape.n_slots && first >= 0 && n >= 0 && first + n <= shape.max_pages,
             "cpu stage: map_pages(slot ", slot, ", pages ", first, "..", first + n - 1, ") outside ", shape.n_slots,
             " slots of ", shape.max_pages, " pages");
  for (int64_t i = 0; i < n; ++i)
    LFM2_CHECK(pages[i] >= 0 && pages[i] < shape.n_pages, "cpu stage: map_pages(slot ", slot, "): page id ", pages[i],
               " outside the pool of ", shape.n_pages);
  std::copy(pages, pages + n, table.begin() + slot * shape.max_pages + first);
}

void CpuDecodeState::check(const StepLayout& step) const {
  LFM2_CHECK(!table.empty(), "cpu stage: generation before its state is allocated");
  for (const PagedSeq& s : step.seqs) {
    const int64_t end = int64_t(s.first_pos) + s.n_rows;
    LFM2_CHECK(s.table_row >= 0 && s.table_row < shape.n_slots && end <= shape.max_positions(), "cpu stage: slot ",
               s.table_row, " at positions ", s.first_pos, "..", end - 1, " outside the state's ", shape.n_slots,
               " slots of ", shape.max_positions(), " positions");
    for (int64_t lp = 0; lp * shape.page_size < end; ++lp)
      LFM2_CHECK(table[size_t(s.table_row * shape.max_pages + lp)] >= 0, "cpu stage: slot ", s.table_row,
                 " has no page for positions from ", lp * shape.page_size, " (map_pages)");
  }
}

void CpuDecodeState::check_old(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
  LFM2_CHECK(!lengths.empty(), "cpu stage: generation before alloc_state()");
  LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= int64_t(lengths.size()) && seq_len <= max_len,
             "cpu stage: sequences [", first_seq, ", ", first_seq + n_seq, ") of ", seq_len,
             " tokens outside the state of ", lengths.size(), " x ", max_len);
}

std::vector<int64_t> CpuDecodeState::decode_positions(int64_t first_seq, int64_t n_seq, int64_t step) const {
  check_old(first_seq, n_seq, 1);
  std::vector<int64_t> pos(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) pos[size_t(i)] = lengths[size_t(first_seq + i)] + step - 1;
  LFM2_CHECK(pos.empty() || *std::max_element(pos.begin(), pos.end()) < max_len, "cpu stage: decode step ", step,
             " reaches past the state's ", max_len, " positions");
  return pos;
}

void CpuDecodeState::restart(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) ended[size_t(s)] = cpu::kNotEnded;
}

}  // namespace lfm2
