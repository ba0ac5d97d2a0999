// One generation step on a stage, as the executor sees it (issues 20 and 26): the rows of several
// sequences in one hidden-state buffer, each sequence at its own positions and in its own state
// slot. The engine builds a StepBatch from an item's plan (rank/engine/step_plan.h); the executor
// never sees the plan.
//
// Rows: decode entries first (one row each: the token chosen for the sequence at the step before,
// fed back from the last stage), then prompt entries (a chunk of a prompt, n_rows >= 1 at any first
// position; a whole prompt from 0 is one chunk). Each kind runs through its own kernels (decode rows:
// the flash-decoding attention, the small-M MoE and GEMMs; prompt rows: the chunked-prefill
// attention, the CUTLASS grouped GEMM, the large-M GEMMs), chosen by kind and never by count, so a
// row's bits depend on nothing but its sequence's tokens and positions: not on the other rows,
// their number, the chunking, the slot or the pages (tested per backend).
//
// State (alloc_batch_state): the KV cache of the stage's attention layers in pages of page_size
// positions from one pool (a page holds those positions for every attention layer of the stage);
// each slot has a block-table row of max_pages page ids (map_pages fills it, in stream order, before
// the step that writes those positions); the conv state (the last conv_L_cache - 1 inputs of each
// conv layer) is per slot. A prompt entry with first_pos 0 starts its slot afresh (the slot's conv
// state is not read, and its EOS state is reset); one with first_pos > 0 continues from it. Every
// stage of a pipeline holds the same number of slots and pages, so one allocation decided on the
// first stage holds for all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lfm2 {

struct BatchSeq {
  int64_t seq = 0;        // the sequence's index in the inputs (input order): keys sampling
  int32_t slot = 0;       // its state slot: conv state row, block-table row, EOS state
  int32_t first_pos = 0;  // the position of its first row
  int32_t n_rows = 0;     // its rows in the buffer: 1 for a decode entry, the chunk for a prompt entry
  int32_t gen_step = -1;  // >= 0: the last stage chooses new token gen_step from its last row
  bool decode = false;    // a decode entry (one row, its token fed back), else prompt rows

  bool operator==(const BatchSeq& o) const;
};

// The counts a StepBatch and the engine's plan (rank/engine/step_plan.h) both keep of their entries
// (anything with n_rows, decode and gen_step): rows, the leading decode entries, the emitting ones.
template <class Entry>
int64_t rows_of(const std::vector<Entry>& seqs) {
  int64_t n = 0;
  for (const Entry& s : seqs) n += s.n_rows;
  return n;
}
template <class Entry>
int64_t leading_decode_entries(const std::vector<Entry>& seqs) {
  int64_t n = 0;
  while (n < int64_t(seqs.size()) && seqs[size_t(n)].decode) ++n;
  return n;
}
template <class Entry>
int64_t emitting_entries(const std::vector<Entry>& seqs) {
  int64_t n = 0;
  for (const Entry& s : seqs) n += s.gen_step >= 0 ? 1 : 0;
  return n;
}

struct StepBatch {
  std::vector<BatchSeq> seqs;  // decode entries first, then prompt entries; rows in this order

  int64_t rows() const { return rows_of(seqs); }
  int64_t n_decode() const { return leading_decode_entries(seqs); }  // the leading ones (a row each)
  int64_t n_emit() const { return emitting_entries(seqs); }  // gen_step >= 0: the last stage's tokens
  // Throws lfm2::Error when the order, a count or a position is impossible (checked by executors).
  void check(int64_t n_slots, int64_t max_positions) const;
};

// A sequence's own sampling (issue 20's per-sequence parameters; SamplingParams holds the defaults
// and the EOS ids). The draw of new token t of sequence seq is keyed by (seed, seq, t).
struct SeqSampling {
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: all
  float top_p = 1;        // in (0, 1]
  uint64_t seed = 0;
};

struct StateShape {
  int64_t n_slots = 0;    // sequences alive at once (--max-seqs)
  int64_t n_pages = 0;    // KV pages in the pool
  int64_t page_size = 0;  // positions per page: a power of two, 16 or more
  int64_t max_pages = 0;  // pages one sequence may hold (block-table width)

  int64_t max_positions() const { return max_pages * page_size; }
  // The most pages a pool may have: fewer than 2^31 positions in all (kernels/paged_kv.h: the CUDA
  // kernels compute a pool row, page * page_size + slot, in 32 bits).
  int64_t max_pool_pages() const { return ((int64_t(1) << 31) - 1) / page_size; }
};

}  // namespace lfm2
