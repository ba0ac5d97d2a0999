// A generation step's rows as an executor's layers run them (both backends): per entry its rows in
// the hidden-state buffer, its positions and its state slot (paged_kv.h's PagedSeq, table_row = the
// slot), built from a StepBatch (model/step_batch.h) or from today's generation calls (prefill and
// decode of consecutive slots, each sequence in the slot of its index), so that both run on the
// same internals. And the rows the last stage chooses tokens from (StepEmit; the choice itself:
// cpu_token_choice.h, cuda_token_choice.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/paged_kv.h"
#include "model/step_batch.h"

namespace lfm2 {

struct StepLayout {
  std::vector<PagedSeq> seqs;  // per entry, decode entries first, ordered by row
  std::vector<int32_t> ends;   // per entry: its rows whose conv inputs end the slot's conv state
                               // (n_rows; a padded prompt of today's prefill: its own length)
  std::vector<int32_t> fresh;  // the slots of prompt entries at position 0 (their EOS state restarts)
  int64_t n_decode = 0;        // the leading decode entries, one row each: rows 0 .. n_decode - 1
  int64_t rows = 0;            // rows in the buffer
  int64_t max_prompt_rows = 0; // the longest prompt entry

  int64_t n_seqs() const { return int64_t(seqs.size()); }

  // The batch API's step (rows contiguous in entry order; check()ed by the caller).
  static StepLayout of(const StepBatch& b);
  // Today's prefill: sequences [first_seq, first_seq + n_seq) of seq_len rows each (padded),
  // from position 0, their conv state at their own lengths (lengths: per sequence of the state).
  static StepLayout prefill(int64_t first_seq, int64_t n_seq, int64_t seq_len, const int32_t* lengths);
  // Today's decode step: sequence first_seq + i at position positions[i], one row each.
  static StepLayout decode(int64_t first_seq, int64_t n_seq, const std::vector<int64_t>& positions);
};

// The state's rules, both executors (`who` names the executor in errors, "cpu stage"): map_pages()'
// slot, entries and page ids fit the shape; every entry of a step has its slot and positions within
// the shape and a page for each position it touches in the host's block table (n_slots, max_pages).
void check_map_pages(const StateShape& shape, int64_t slot, int64_t first, const int32_t* pages, int64_t n,
                     const char* who);
void check_step_pages(const StepLayout& step, const StateShape& shape, const int32_t* table, const char* who);

// Today's state of n_seq sequences of at most max_len positions in the batch API's terms: a slot per
// sequence, ceil(max_len / page_size) pages each (pages of 16, 64 or 256 positions as max_len grows).
StateShape old_state_shape(int64_t n_seq, int64_t max_len);

// Today's calls' sequences on a generation state (both executors): sequence i in slot i, its prompt
// length, and the positions the state holds. `who` names the executor in errors ("cpu stage").
struct OldCalls {
  std::vector<int32_t> lengths;  // per sequence; empty: a batch API's state (or none)
  int64_t max_len = 0;

  // Sequences [first_seq, first_seq + n_seq) of seq_len positions fit the state.
  void check(int64_t first_seq, int64_t n_seq, int64_t seq_len, const char* who) const;
  // The positions of their decode step `step` (lengths[s] + step - 1), each checked against max_len.
  std::vector<int64_t> decode_positions(int64_t first_seq, int64_t n_seq, int64_t step, const char* who) const;
};

// A row the last stage chooses a token from: sampled by (seed, seq, gen_step); slot keeps its EOS state.
struct StepEmit {
  int64_t row = 0;
  int32_t slot = 0;
  int64_t seq = 0;
  int64_t gen_step = 0;
};

// The batch API's emitting entries (gen_step >= 0), their last rows, in entry order.
std::vector<StepEmit> step_emits(const StepBatch& b);
// Today's choose(): sequence first_seq + i of seq_len rows at its last row (its own length - 1 after
// a prefill, its one row after a decode step); seq keyed from first_sequence (SamplingParams).
std::vector<StepEmit> step_emits(int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step,
                                 const int32_t* lengths, int64_t first_sequence);

}  // namespace lfm2
