// The generation job on one stage (SPEC §3 "Generation") with a static schedule: prompts in, new
// tokens out. Its schedule (schedulers.h: (step, microbatch) items, step-major, each decode step
// embedding the tokens the last stage chose in the step before), and its memory on this stage: the
// prompts packed on the first, a token slot per microbatch on the first and last (the feedback),
// every chosen token on the last. The executor holds each sequence's state (the batch API's slots
// and KV pages: sequence s in slot s, its pages granted by its prefill). Token choice (greedy or
// sampled, SamplingParams) is keyed by (seed, sequence, step), so the tokens do not depend on P or
// the microbatch size. The job's flow over the whole job is generation.cpp (run_generation).
#pragma once

#include <cstdint>
#include <vector>

#include "model/stage_executor.h"
#include "plan/microbatch.h"
#include "rank/engine/stage_steps.h"
#include "rank/engine/step_plan.h"
#include "rank/mpi/world.h"

namespace lfm2 {

struct GenerateShape {
  int64_t n_seq = 0, seq_len = 0;  // the prompts (N, S), right-padded
  int64_t microbatch = 1;          // sequences per microbatch
  int64_t hidden = 0;
  int64_t max_new_tokens = 1;      // K
  std::vector<int32_t> lengths;    // (N) prompt lengths (empty: all S)
  int64_t prefill_chunk = 0;       // rows a prefill item holds at most (0: whole prompts)

  int64_t n_micro() const { return n_microbatches(n_seq, microbatch); }
  int64_t micro_size(int64_t g) const;
  int64_t max_len() const { return seq_len + max_new_tokens - 1; }  // cache positions per sequence
  StateShape state() const;                                          // slots and pages for all N
  int64_t max_item_tokens() const;
};

struct GenerateResult {
  int64_t n_new = 0;                // K
  std::vector<int32_t> generated;   // (N, K); after an EOS, that EOS id repeated
  std::vector<int32_t> n_generated; // (N) tokens up to and including the first EOS, else K
};

class GenerateJob {
 public:
  // Allocates this stage's state and buffers through the executor (before the ready agreement).
  GenerateJob(const WorldConfig& world, StageExecutor& exec, const GenerateShape& shape, const SamplingParams& sampling);

  void set_ids(const int32_t* ids);                  // first rank: the prompts (N, S)
  void take_results(GenerateResult* result) const;  // last rank, after Pipeline::run
  // Print sequence 0's tokens as they are chosen (the last rank; one host wait per step).
  void set_stream(bool on) { memory_.stream_tokens = on ? shape_.max_new_tokens : 0; }
  // Run only the first `steps` steps (1: the prefill and the first token), at most max_new_tokens.
  void set_steps(int64_t steps);

  const GenerateShape& shape() const { return shape_; }
  int64_t steps() const { return steps_; }
  // What Pipeline::run takes: the plans of every item (of the steps set), and this stage's memory.
  const std::vector<StepPlan>& schedule() const { return schedule_; }
  const StepMemory& memory() const { return memory_; }

 private:
  WorldConfig world_;
  StageExecutor& exec_;
  GenerateShape shape_;
  std::vector<int32_t> eos_;
  int64_t steps_ = 1;
  int32_t* ids_ = nullptr;           // first stage: the prompts unpadded, one after the other (alloc_host)
  std::vector<int32_t*> tokens_;     // per microbatch: its last chosen tokens (first and last stage)
  int32_t* last_tokens_ = nullptr;   // the last step's tokens (fed back to nobody)
  int32_t* host_tokens_ = nullptr;   // (N * K) last stage, alloc_host memory: each item's tokens (emit_offset)
  std::vector<StepPlan> schedule_;
  StepMemory memory_;
};

}  // namespace lfm2
