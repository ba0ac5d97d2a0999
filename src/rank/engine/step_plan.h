// The step plan: what one item of a run carries through every stage, as plain data.
//
// An item is one step of the pipeline: its rows enter the first stage together, cross every
// stage's layers and leave the last stage as results (scoring's top-1 and logits) or chosen tokens
// (generation). A pure scheduler (jobs/schedulers.h, batching/batch_scheduler.h) decides, item by item,
// which sequences an item carries, which of their positions, in which state slots, which KV pages
// they are granted, and what feedback it waits for; the engine only interprets the plans
// (stage_program.h), and a schedule's timeline can be drawn from them alone (schedule_chart.h). A
// plan serialises to a small flat buffer (to_bytes): static schedules are replayed on every rank
// from what start-up agreed on; the continuous-batching scheduler on the first stage sends each
// plan along with the hidden states (plan_link.h).
//
// Rows: scoring holds each prompt padded to the item's width (its n_tokens rows first, padding
// after). Generation is the executor's batch step (model/step_batch.h): decode entries first (one
// row each, its token fed back), then prompt chunks (n_rows rows from first_pos, no padding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/step_batch.h"

namespace lfm2 {

// One sequence's rows in an item, in row order.
struct SeqRows {
  int64_t seq = 0;        // the job's sequence (input order; static schedules: the replica's index):
                          // keys sampling, results
  int32_t slot = 0;       // its state slot on every stage (KV block-table row, conv state row)
  int32_t first_pos = 0;  // the position of its first row
  int32_t n_rows = 0;     // rows in the item: a scored prompt padded to the item's width, a prompt
                          // chunk, or one decode row
  int32_t n_tokens = 0;   // of them, its own tokens (scoring: the rest is padding; generation: n_rows)
  int32_t gen_step = -1;  // generation: the new token the last stage chooses from its last row (0: the
                          // first, after the prompt); -1: none (scoring: the head reads it)
  bool decode = false;    // generation: a decode row (its token fed back), else prompt rows

  bool operator==(const SeqRows& o) const;
};

// A KV page given to a slot: block-table entry (slot, index) = page, mapped on every stage before
// the item's layers (StageExecutor::map_pages).
struct PageGrant {
  int32_t slot = 0;
  int32_t index = 0;  // the slot's logical page (positions index * page_size ..)
  int32_t page = 0;   // the pool's physical page

  bool operator==(const PageGrant& o) const { return slot == o.slot && index == o.index && page == o.page; }
};

struct StepPlan {
  // kScore: the forward pass and the head (top-1, logits). Generation, by what the item carries:
  // kPrefill (prompt rows only), kDecode (decode rows only), kMixed (both). Each runs the same
  // batch step; the kind only names it.
  enum class Kind : int32_t { kScore = 0, kPrefill = 1, kDecode = 2, kMixed = 3 };

  int64_t item = 0;            // order in the run
  Kind kind = Kind::kScore;
  int64_t micro = 0;           // the microbatch (static schedules: a fixed group of sequences)
  std::vector<SeqRows> seqs;   // in row order
  std::vector<PageGrant> grants;  // pages mapped before this item's layers, in order
  // The tokens its decode entries embed: fed back from the last stage's tokens of item
  // feedback_from through feedback slot feedback_slot (the device; -1: none), or, without one,
  // `fed` (one per decode entry, from the first stage's host: the continuous scheduler knows them).
  int64_t feedback_from = -1;
  int32_t feedback_slot = -1;
  int32_t feeds_slot = -1;     // the slot this item's chosen tokens go to for a later item (-1: none)
  std::vector<int32_t> fed;
  // Continuous batching on one stage (look-ahead): per decode entry, its fed token's index among the
  // chosen tokens of item `item - 1`, still on the device (the last stage's chosen-tokens buffer,
  // which item - 1 wrote just before), or -1: `fed`'s, from the host. Empty: every one from the
  // host. Such plans never travel (one stage).
  std::vector<int32_t> fed_chosen;
  // Per emitting entry, in entry order, its own sampling (empty: the job's defaults).
  std::vector<SeqSampling> sampling;
  int64_t emit_offset = -1;    // static generation: where its tokens go among the run's (-1: none)
  int64_t ids_offset = -1;     // static generation: where its prompt rows' ids start among the run's
  bool reports = false;        // the last stage sends its chosen tokens to the first stage's host

  int64_t rows() const { return rows_of(seqs); }
  int64_t n_seqs() const { return int64_t(seqs.size()); }
  int64_t n_decode() const { return leading_decode_entries(seqs); }
  int64_t n_emit() const { return emitting_entries(seqs); }  // entries with gen_step >= 0
  bool generation() const { return kind != Kind::kScore; }
  // "microbatch 3", "the prefill of microbatch 1", "step 2 of microbatch 0", "item 9": how errors
  // name it.
  std::string name() const;
  bool operator==(const StepPlan& o) const;
};

// The kind of a generation item from its entries.
StepPlan::Kind generation_kind(const std::vector<SeqRows>& seqs);

// The plan as a flat little-endian buffer: a 76-byte header, then 32 bytes per sequence, 12 per
// page grant, 4 per fed token and 20 per sampling entry.
std::vector<uint8_t> to_bytes(const StepPlan& plan);
// The plan back from to_bytes(); throws on a buffer of the wrong size or kind.
StepPlan plan_from_bytes(const uint8_t* bytes, size_t n);

}  // namespace lfm2
