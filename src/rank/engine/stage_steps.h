// A stage's compute for one item: a plan's input, layers and output as calls of the stage's
// executor (model/stage_executor.h), chosen by the plan's kind alone.
//
//   kind        input (first stage)          layers                     output (last stage)
//   kScore      embed(prompts)               forward                    head: top-1, margin, logits
//   generation  embed_batch(prompt rows,     map_pages(the plan's       choose_batch: a token per
//   (prefill,   fed tokens) + finished       grants), forward_batch     emitting entry
//   decode,     flags                        (reads and extends each
//   mixed)                                   entry's slot)
//
// Besides the hidden states a step reads and writes the job's memory on this stage (StepMemory:
// memory the executor allocated for it). A scored item is one contiguous block of sequences of one
// width; a generation item is any batch step (model/step_batch.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "model/stage_executor.h"
#include "model/step_batch.h"
#include "rank/engine/stage_program.h"
#include "rank/engine/step_plan.h"

namespace lfm2 {

// First stage, continuous batching: an item's host inputs staged where the executor reads them.
struct StagedInput {
  const int32_t* prompt_ids = nullptr;  // alloc_host memory: the prompt entries' ids, in entry order
  const int32_t* fed = nullptr;         // alloc_tokens memory: the decode entries' tokens (plan.fed)
};
class InputStaging {
 public:
  virtual ~InputStaging() = default;
  // Queues the item's ids into memory that stays unchanged until its queued work is done.
  virtual StagedInput stage(const StepPlan& plan) = 0;
};

// The job's memory on this stage (host memory from the executor's alloc_host, token buffers from
// its alloc_tokens); what a stage does not use stays null.
struct StepMemory {
  // ---- scoring
  const int32_t* ids = nullptr;      // (N, width) first stage: the prompts
  int64_t width = 0;                 // the prompts' width (padded)
  HeadOutputs head;                  // last stage: next_token, margin (N), logits (N, V), all_logits (N, width, V)
  const int32_t* lengths = nullptr;  // (N) last stage: the head reads lengths[s] - 1 (null: width - 1)
  int64_t vocab = 0;
  // ---- generation
  int64_t seq_base = 0;                // added to a plan's seq for the executor (sampling's key)
  const int32_t* packed_ids = nullptr;  // first stage, static schedules: every item's prompt rows'
                                       // ids, item after item (ids_offset)
  InputStaging* staging = nullptr;     // first stage, continuous batching: plans with host-fed tokens
  std::vector<int32_t*> token_slots;   // first and last stage: per feedback slot, its tokens
  int32_t* spare_tokens = nullptr;     // last stage: the tokens of items that feed nobody (with one
                                       // stage, look-ahead: the next item's fed_chosen read them)
  int32_t* fed_tokens = nullptr;       // first stage, look-ahead: an item's fed tokens gathered from
                                       // spare_tokens and the staging (n_slots)
  int32_t* host_emits = nullptr;       // last stage, static schedules: the run's tokens (emit_offset)
  std::vector<int32_t*> report_tokens;  // last stage, reporting items: item i's tokens on the host in
                                        // report_tokens[i % size] (a ring: reports may wait)
  int64_t stream_tokens = 0;           // > 0 (static schedules' --stream): every chosen token as a JSON event
                                       // line, {"seq": N, "token": ID} (one host wait per item)
};

// The executor's view of a generation item (seq_base added to each sequence).
StepBatch batch_of(const StepPlan& plan, int64_t seq_base);

// Bytes of hidden states an item carries between stages: its rows, and after a generation item's
// rows the finished flags of its decode entries (model/stage_executor.h's decode_flags).
size_t item_bytes(const StepPlan& plan, int64_t hidden, DType act_dtype);
// Tokens of hidden-state buffer an item needs (alloc_hidden).
int64_t item_tokens(const StepPlan& plan, int64_t hidden);

// The name of a compute step in busy spans and traces: "embed", "forward" / "layers", "head" / "choose".
const char* step_name(StageOp op, StepPlan::Kind kind);

// Runs (or, on a device, queues) one compute step (kInput, kLayers or kOutput) of an item on x.
void run_step(StageOp op, const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem);

// Last stage: where a reporting item's chosen tokens land on the host.
int32_t* report_tokens(const StepMemory& mem, int64_t item);

// Generation's feedback: the token buffer of a slot, and the bytes of an item's chosen tokens.
int32_t* feedback_tokens(const StepMemory& mem, int slot);
size_t feedback_bytes(const StepPlan& plan);

}  // namespace lfm2
