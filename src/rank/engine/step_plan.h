// The step plan: what one item of a run carries through every stage, as plain data.
//
// An item is one microbatch-step: its sequences' rows enter the first stage together, cross every
// stage's layers and leave the last stage as results (scoring's top-1 and logits) or chosen tokens
// (generation). A pure scheduler (jobs/schedulers.h) decides, item by item, which sequences an item
// carries, which of their positions, and what feedback it waits for; the engine only interprets the
// plans (stage_program.h), and a schedule's timeline can be drawn from them alone
// (schedule_chart.h). A plan serialises to a small flat buffer (to_bytes), so that a scheduler on
// the first stage can send it along with the hidden states; today's static schedules are replayed
// on every rank from the inputs' shape that start-up agreed on.
//
// Rows: an item's buffer holds its sequences one after the other, each n_rows rows; a prompt is
// padded to the item's width (its n_tokens rows first, padding after), a decode step is one row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lfm2 {

// One sequence's rows in an item, in row order.
struct SeqRows {
  int64_t seq = 0;        // the job's sequence (this replica's index, input order): keys sampling, results
  int64_t slot = 0;       // its state slot on every stage (KV cache / conv state row)
  int32_t first_pos = 0;  // the position of its first row
  int32_t n_rows = 0;     // rows in the item: a prompt padded to the item's width, or one decode row
  int32_t n_tokens = 0;   // of them, its own tokens (the rest is padding); the last one is read
  int32_t gen_step = -1;  // generation: which new token the last stage chooses from it (0: the
                          // first, after the prompt); -1: scoring (the head reads it)

  bool operator==(const SeqRows& o) const;
};

struct StepPlan {
  // kScore: the forward pass and the head (top-1, logits); kPrefill: the forward pass storing each
  // sequence's state, then the first token; kDecode: one row per sequence, reading and extending
  // its state, then the next token.
  enum class Kind : int32_t { kScore = 0, kPrefill = 1, kDecode = 2 };

  int64_t item = 0;            // order in the run
  Kind kind = Kind::kScore;
  int64_t micro = 0;           // the microbatch (a fixed group of sequences): names the item
  std::vector<SeqRows> seqs;   // in row order
  int64_t feedback_from = -1;  // the item whose chosen tokens this item's decode rows embed (-1: none)
  int32_t feedback_slot = -1;  // the slot they wait in (one per microbatch)
  int32_t feeds_slot = -1;     // the slot this item's chosen tokens go to for a later item (-1: none)

  int64_t rows() const;
  int64_t n_seqs() const { return int64_t(seqs.size()); }
  // "microbatch 3", "the prefill of microbatch 1", "step 2 of microbatch 0": how errors name it.
  std::string name() const;
  bool operator==(const StepPlan& o) const;
};

// The plan as a flat little-endian buffer: a 44-byte header and 32 bytes per sequence.
std::vector<uint8_t> to_bytes(const StepPlan& plan);
// The plan back from to_bytes(); throws on a buffer of the wrong size or kind.
StepPlan plan_from_bytes(const uint8_t* bytes, size_t n);

}  // namespace lfm2
