// The jobs' schedulers: pure functions from a replica's block of sequences to the step plans of a
// run (engine/step_plan.h), one per item, in the order every stage runs them. No threads, no MPI:
// every rank of a pipeline computes the same schedule from what start-up agreed on.
//
// Scoring: one item per microbatch of `microbatch` sequences (the last may hold fewer), each prompt
// padded to the block's width; the last stage's head reads each prompt's own last token.
//
// Generation (static): G microbatches and `steps` items each, step-major: item t * G + g is step t
// of microbatch g. Step 0 is the prefill of the microbatch's prompts (each stage stores their KV
// cache and conv state) and chooses each sequence's first token; step t >= 1 embeds the tokens of
// step t - 1 (fed back from the last stage through the microbatch's slot) and decodes one position.
// With G >= P the microbatches keep every stage busy: while stage r runs microbatch g's step t,
// stage r+1 runs g-1's.
#pragma once

#include <cstdint>
#include <vector>

#include "rank/engine/step_plan.h"

namespace lfm2 {

// lengths: each prompt's tokens (N); empty: every prompt is `width` tokens.
std::vector<StepPlan> score_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                     const std::vector<int32_t>& lengths);

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps);

}  // namespace lfm2
