// A stage's compute for one item: a plan's input, layers and output as calls of the stage's
// executor (model/stage_executor.h), chosen by the plan's kind alone.
//
//   kind      input (first stage)         layers             output (last stage)
//   kScore    embed(prompts)              forward            head: top-1, margin, logits
//   kPrefill  embed(prompts)              prefill (stores    choose the first token
//                                         the state)
//   kDecode   embed_tokens(fed-back       decode (one row    choose the next token
//             tokens) + finished flags    per sequence)
//
// Besides the hidden states a step reads and writes the job's memory on this stage (StepMemory:
// memory the executor allocated for it). Today's executors take an item's sequences as one
// contiguous block of equal width; a plan that is not is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "model/stage_executor.h"
#include "rank/engine/stage_program.h"
#include "rank/engine/step_plan.h"

namespace lfm2 {

// The job's memory on this stage (host memory from the executor's alloc_host, token buffers from
// its alloc_tokens); what a stage does not use stays null.
struct StepMemory {
  const int32_t* ids = nullptr;      // (N, width) first stage: the prompts, for kScore and kPrefill items
  int64_t width = 0;                 // the prompts' width (padded)
  HeadOutputs head;                  // last stage, scoring: next_token, margin (N), logits (N, V),
                                     // all_logits (N, width, V)
  const int32_t* lengths = nullptr;  // (N) last stage, scoring: the head reads lengths[s] - 1 (null: width - 1)
  int64_t vocab = 0;
  std::vector<int32_t*> token_slots;  // generation, first and last stage: per feedback slot, its tokens
  int32_t* spare_tokens = nullptr;    // last stage: the tokens of items that feed nobody
  int32_t* host_tokens = nullptr;     // last stage: every chosen token (steps, N), step-major
  int64_t n_seq = 0;                  // N
  int64_t stream_tokens = 0;          // > 0: print sequence 0's tokens as chosen ("token t/K", one host wait each)
};

// Bytes of hidden states an item carries between stages: its rows, and after a decode item's rows
// its finished flags (model/stage_executor.h's decode_buffer_floats).
size_t item_bytes(const StepPlan& plan, int64_t hidden, DType act_dtype);

// The name of a compute step in busy spans and traces: "embed", "forward" / "layers", "head" / "choose".
const char* step_name(StageOp op, StepPlan::Kind kind);

// Runs (or, on a device, queues) one compute step (kInput, kLayers or kOutput) of an item on x.
void run_step(StageOp op, const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem);

// Generation's feedback: the token buffer of a slot, and the bytes of an item's chosen tokens.
int32_t* feedback_tokens(const StepMemory& mem, int slot);
size_t feedback_bytes(const StepPlan& plan);

}  // namespace lfm2
