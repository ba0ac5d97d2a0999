// A generation step's rows as an executor's layers run them (both backends): per entry its rows in
// the hidden-state buffer, its positions and its state slot (paged_kv.h's PagedSeq, table_row = the
// slot), built from a StepBatch (model/step_batch.h) or from today's generation calls (prefill and
// decode of consecutive slots, each sequence in the slot of its index), so that both run on the
// same internals. And the rows the last stage chooses tokens from (StepEmit).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/paged_kv.h"
#include "kernels/sample.h"
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
  int64_t prompt_rows() const { return rows - n_decode; }
  // The last position any entry writes, + 1.
  int64_t end_positions() const;

  // The batch API's step (rows contiguous in entry order; check()ed by the caller).
  static StepLayout of(const StepBatch& b);
  // Today's prefill: sequences [first_seq, first_seq + n_seq) of seq_len rows each (padded),
  // from position 0, their conv state at their own lengths (lengths: per sequence of the state).
  static StepLayout prefill(int64_t first_seq, int64_t n_seq, int64_t seq_len, const int32_t* lengths);
  // Today's decode step: sequence first_seq + i at position positions[i], one row each.
  static StepLayout decode(int64_t first_seq, int64_t n_seq, const std::vector<int64_t>& positions);
};

// Today's state of n_seq sequences of at most max_len positions in the batch API's terms: a slot per
// sequence, ceil(max_len / page_size) pages each (pages of 16, 64 or 256 positions as max_len grows).
StateShape old_state_shape(int64_t n_seq, int64_t max_len);

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

// The host's token choice for emitting rows (both backends; the GPU's sampling path): tokens[i] from
// logits row i (emits.size() rows of vocab), sampled by params[i] where given (else the defaults'
// temperature, top-k, top-p and seed), keyed by (seed, emits[i].seq, gen_step), the EOS rule on
// ended[emits[i].slot] (cpu::choose_tokens).
void choose_emitted(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
                    const SamplingParams& defaults, const SeqSampling* params, int32_t* ended, int n_threads);

}  // namespace lfm2
