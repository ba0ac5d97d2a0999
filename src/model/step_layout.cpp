#include "model/step_layout.h"

#include <algorithm>

#include "common/error.h"

namespace lfm2 {

StepLayout StepLayout::of(const StepBatch& b) {
  StepLayout l;
  int32_t row = 0;
  for (const BatchSeq& s : b.seqs) {
    l.seqs.push_back(PagedSeq{row, s.n_rows, s.first_pos, s.slot});
    l.ends.push_back(s.n_rows);
    if (s.decode) ++l.n_decode;
    if (!s.decode) l.max_prompt_rows = std::max<int64_t>(l.max_prompt_rows, s.n_rows);
    if (!s.decode && s.first_pos == 0) l.fresh.push_back(s.slot);
    row += s.n_rows;
  }
  l.rows = row;
  return l;
}

StepLayout StepLayout::prefill(int64_t first_seq, int64_t n_seq, int64_t seq_len, const int32_t* lengths) {
  StepLayout l;
  for (int64_t i = 0; i < n_seq; ++i) {
    const int32_t slot = int32_t(first_seq + i);
    l.seqs.push_back(PagedSeq{int32_t(i * seq_len), int32_t(seq_len), 0, slot});
    l.ends.push_back(lengths[slot]);
    l.fresh.push_back(slot);
  }
  l.rows = n_seq * seq_len;
  l.max_prompt_rows = n_seq > 0 ? seq_len : 0;
  return l;
}

StepLayout StepLayout::decode(int64_t first_seq, int64_t n_seq, const std::vector<int64_t>& positions) {
  StepLayout l;
  for (int64_t i = 0; i < n_seq; ++i) {
    l.seqs.push_back(PagedSeq{int32_t(i), 1, int32_t(positions[size_t(i)]), int32_t(first_seq + i)});
    l.ends.push_back(1);
  }
  l.n_decode = l.rows = n_seq;
  return l;
}

void check_map_pages(const StateShape& shape, int64_t slot, int64_t first, const int32_t* pages, int64_t n,
                     const char* who) {
  LFM2_CHECK(slot >= 0 && slot < shape.n_slots && first >= 0 && n >= 0 && first + n <= shape.max_pages, who,
             ": map_pages(slot ", slot, ", pages ", first, "..", first + n - 1, ") outside ", shape.n_slots,
             " slots of ", shape.max_pages, " pages");
  for (int64_t i = 0; i < n; ++i)
    LFM2_CHECK(pages[i] >= 0 && pages[i] < shape.n_pages, who, ": map_pages(slot ", slot, "): page id ", pages[i],
               " outside the pool of ", shape.n_pages);
}

void check_step_pages(const StepLayout& step, const StateShape& shape, const int32_t* table, const char* who) {
  for (const PagedSeq& s : step.seqs) {
    const int64_t end = int64_t(s.first_pos) + s.n_rows;
    LFM2_CHECK(s.table_row >= 0 && s.table_row < shape.n_slots && end <= shape.max_positions(), who, ": slot ",
               s.table_row, " at positions ", s.first_pos, "..", end - 1, " outside the state's ", shape.n_slots,
               " slots of ", shape.max_positions(), " positions");
    for (int64_t lp = 0; lp * shape.page_size < end; ++lp)
      LFM2_CHECK(table[size_t(s.table_row * shape.max_pages + lp)] >= 0, who, ": slot ", s.table_row,
                 " has no page for positions from ", lp * shape.page_size, " (map_pages)");
  }
}

StateShape old_state_shape(int64_t n_seq, int64_t max_len) {
  StateShape s;
  s.n_slots = n_seq;
  s.page_size = max_len >= 4096 ? 256 : max_len >= 256 ? 64 : 16;
  s.max_pages = (max_len + s.page_size - 1) / s.page_size;
  s.n_pages = n_seq * s.max_pages;
  return s;
}

void OldCalls::check(int64_t first_seq, int64_t n_seq, int64_t seq_len, const char* who) const {
  LFM2_CHECK(!lengths.empty(), who, ": generation before alloc_state()");
  LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= int64_t(lengths.size()) && seq_len <= max_len, who,
             ": sequences [", first_seq, ", ", first_seq + n_seq, ") of ", seq_len, " tokens outside the state of ",
             lengths.size(), " x ", max_len);
}

std::vector<int64_t> OldCalls::decode_positions(int64_t first_seq, int64_t n_seq, int64_t step,
                                                const char* who) const {
  check(first_seq, n_seq, 1, who);
  std::vector<int64_t> pos(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) {
    pos[size_t(i)] = lengths[size_t(first_seq + i)] + step - 1;
    LFM2_CHECK(pos[size_t(i)] < max_len, who, ": decode step ", step, " of sequence ", first_seq + i,
               " reaches past the state's ", max_len, " positions");
  }
  return pos;
}

std::vector<StepEmit> step_emits(const StepBatch& b) {
  std::vector<StepEmit> e;
  int64_t row = 0;
  for (const BatchSeq& s : b.seqs) {
    row += s.n_rows;
    if (s.gen_step >= 0) e.push_back(StepEmit{row - 1, s.slot, s.seq, s.gen_step});
  }
  return e;
}

std::vector<StepEmit> step_emits(int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step,
                                 const int32_t* lengths, int64_t first_sequence) {
  std::vector<StepEmit> e;
  for (int64_t i = 0; i < n_seq; ++i) {
    const int64_t s = first_seq + i;
    const int64_t last = seq_len == 1 ? 0 : lengths[s] - 1;
    e.push_back(StepEmit{i * seq_len + last, int32_t(s), first_sequence + s, step});
  }
  return e;
}

}  // namespace lfm2
