// The jobs' static schedulers: pure functions from a replica's block of sequences to the step plans
// of a run (engine/step_plan.h), one per item, in the order every stage runs them. No threads, no
// MPI: every rank of a pipeline computes the same schedule from what start-up agreed on. (The
// continuous-batching scheduler decides item by item on the first stage: batch_scheduler.h.)
//
// Scoring: one item per microbatch of `microbatch` sequences (the last may hold fewer), each prompt
// padded to the block's width; the last stage's head reads each prompt's own last token.
//
// Generation (static): G microbatches and `steps` steps each, step-major: every microbatch's prefill,
// then step 1 of each, step 2 of each, ... (without prefill chunks, item t * G + g is step t of
// microbatch g). Sequence s lives in slot s on pages s * m .. s * m + m - 1 (m = the state's
// max_pages), granted by its microbatch's first prefill item. Step 0 is the prefill of the
// microbatch's prompts (unpadded from position 0: each stage stores their KV cache and conv state;
// one item, or with prefill_chunk C items of at most C rows, then one of each prompt's last row)
// and chooses each sequence's first token; step t >= 1 embeds the tokens of step t - 1 (fed back
// from the last stage through the microbatch's slot) and decodes one position. With G >= P the
// microbatches keep every stage busy: while stage r runs microbatch g's step t, stage r+1 runs
// g-1's. The prompt rows' ids are laid out item after item (ids_offset), the tokens go to the last
// stage's host in item order (emit_offset).
#pragma once

#include <cstdint>
#include <vector>

#include "model/step_batch.h"
#include "rank/engine/step_plan.h"

namespace lfm2 {

// lengths: each prompt's tokens (N); empty: every prompt is `width` tokens.
std::vector<StepPlan> score_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                     const std::vector<int32_t>& lengths);

// state: the slots and pages (n_slots >= n_seq, max_positions >= width + steps - 1); prefill_chunk:
// rows of prompt a prefill item holds at most (0: whole prompts).
std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps,
                                          const StateShape& state, int64_t prefill_chunk = 0);
// The state today's generation allocates for it (model/step_layout.h's old_state_shape).
std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps);

}  // namespace lfm2
