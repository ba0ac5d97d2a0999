// The scoring job on one stage (the forward pass of a batch, next token and logits at each
// sequence's last position): its schedule (schedulers.h: one item per microbatch), and its memory
// on this stage: the prompts on the first, the head's results in pinned host memory on the last
// (each sequence's top-1 and margin and, where someone reads them, its logits). Each microbatch's
// rows are computed independently of how the batch was cut, so the results are bit-identical for
// any P and microbatch size. The job's flow over the whole job is scoring.cpp (run_scoring).
#pragma once

#include <cstdint>
#include <vector>

#include "model/stage_executor.h"
#include "plan/microbatch.h"
#include "rank/engine/stage_steps.h"
#include "rank/engine/step_plan.h"
#include "rank/mpi/world.h"

namespace lfm2 {

struct PipelineShape {
  int64_t n_seq = 0, seq_len = 0;  // the whole batch (N, S)
  int64_t microbatch = 1;          // sequences per microbatch
  int64_t hidden = 0, vocab = 0;
  bool logits = true;       // bring the last position's logits to the host (else next token and margin only)
  bool all_logits = false;  // also the logits of every position
  std::vector<int32_t> lengths;  // (N) prompt lengths: the head reads position lengths[i] - 1; empty: S

  int64_t n_micro() const { return n_microbatches(n_seq, microbatch); }
  int64_t micro_begin(int64_t m) const { return m * microbatch; }
  int64_t micro_size(int64_t m) const;
  int64_t max_micro_tokens() const;
};

// Results, filled on the last rank only.
struct PipelineResult {
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> margin;        // (N) top-1 logit minus the runner-up's
  std::vector<float> logits;        // (N, V) last position, when shape.logits
  std::vector<float> all_logits;    // (N, S, V) with all_logits
};

class ScoreJob {
 public:
  // Allocates what this stage needs through the executor (before the ready agreement): the ids
  // on the first stage, the results on the last.
  ScoreJob(const WorldConfig& world, StageExecutor& exec, const PipelineShape& shape);

  // The batch to score: ids (N, S), needed on the first rank only (copied into pinned memory).
  void set_ids(const int32_t* ids);
  // After Pipeline::run: the last rank's results.
  void take_results(PipelineResult* result) const;

  const PipelineShape& shape() const { return shape_; }
  // What Pipeline::run takes: the plans of every item, and this stage's memory.
  const std::vector<StepPlan>& schedule() const { return schedule_; }
  const StepMemory& memory() const { return memory_; }

 private:
  WorldConfig world_;
  StageExecutor& exec_;
  PipelineShape shape_;
  std::vector<StepPlan> schedule_;
  StepMemory memory_;
  int32_t* ids_ = nullptr;         // (N, S) first stage, alloc_host memory
  int32_t* next_token_ = nullptr;  // (N) last stage, alloc_host memory
  float* margin_ = nullptr;        // (N)
  float* logits_ = nullptr;        // (N, V) with shape.logits
  float* all_logits_ = nullptr;    // (N, S, V) with shape.all_logits
  int32_t* lengths_ = nullptr;     // (N) last stage with shape.lengths
};

}  // namespace lfm2
