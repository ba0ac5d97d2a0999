// A StageExecutor that checks what another one makes: after each embed, forward and head of every
// microbatch, the hidden states (and the head's logits and margins) must be finite. The first NaN
// or +-Inf throws lfm2::NonFiniteError naming the layers and the microbatch ("NaN/Inf in the hidden
// states after layers 2-3, microbatch 1 (sequences 4-7): ..."), which ends the job with exit code 4;
// with allow_nonfinite it logs one warning per rank and lets the run go on (for debugging).
//
// Host executors (CPU): the buffers are read as soon as each step returns (one pass over
// n_tokens x hidden floats, about 1% of a layer's work), and the head always computes into a logits
// buffer that is checked whole. Device executors: StageExecutor::count_nonfinite queues a count per
// microbatch on the device, read at synchronize(), the end of each run; the head's host outputs
// (margins, logits where asked for) are checked then too. The microbatch of a call is the number of
// calls of that kind so far, modulo the microbatches of a run. Generation checks the hidden states
// after every prefill and decode step (on a device: one count per microbatch and step); a device's
// greedy choice of the next token is not checked (no margin is made there).
#pragma once

#include <cstdint>
#include <memory>

#include "model/stage_executor.h"

namespace lfm2 {

// What the checks need to know of a run: its microbatches and the sizes of a token's hidden state
// and logits.
struct CheckShape {
  int64_t n_micro = 1;     // microbatches per run
  int64_t microbatch = 1;  // sequences per microbatch (the last may hold fewer)
  int64_t hidden = 0, vocab = 0;
  int64_t first_seq = 0;   // the inputs' index of sequence 0 (a replica's block), for the messages
};

// `inner` must outlive the result.
std::unique_ptr<StageExecutor> make_checked_stage(StageExecutor& inner, const StageLayers& stage,
                                                  const CheckShape& shape, int n_threads, bool allow_nonfinite);

}  // namespace lfm2
