#include "model/step_layout.h"

#include <algorithm>

#include "common/parallel.h"

namespace lfm2 {

int64_t StepLayout::end_positions() const {
  int64_t end = 0;
  for (const PagedSeq& s : seqs) end = std::max<int64_t>(end, int64_t(s.first_pos) + s.n_rows);
  return end;
}

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

StateShape old_state_shape(int64_t n_seq, int64_t max_len) {
  StateShape s;
  s.n_slots = n_seq;
  s.page_size = max_len >= 4096 ? 256 : max_len >= 256 ? 64 : 16;
  s.max_pages = (max_len + s.page_size - 1) / s.page_size;
  s.n_pages = n_seq * s.max_pages;
  return s;
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

void choose_emitted(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
                    const SamplingParams& defaults, const SeqSampling* params, int32_t* ended, int n_threads) {
  parallel_for(int64_t(emits.size()), n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const StepEmit& em = emits[size_t(i)];
      SamplingParams p = defaults;
      if (params) {
        p.temperature = params[i].temperature;
        p.top_k = params[i].top_k;
        p.top_p = params[i].top_p;
        p.seed = params[i].seed;
      }
      p.first_sequence = em.seq - em.slot;  // the draw is keyed by first_sequence + slot = seq
      const int64_t slot = em.slot;
      cpu::choose_tokens(tokens + i, logits + i * vocab, 1, vocab, &slot, em.gen_step, p, ended, 1);
    }
  }, 1);
}

}  // namespace lfm2
