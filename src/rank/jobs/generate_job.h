// Generation (SPEC §3 "Generation") as a pipeline job: prompts in, new tokens out.
//
// Items are (step, microbatch) pairs in step-major order: item t * G + g is step t of microbatch
// g (G microbatches). Step 0 is the prefill of the microbatch's prompts (each stage stores their
// KV cache and conv state) and chooses each sequence's first new token; step t >= 1 feeds back the
// token of step t-1 (the last stage sends it to the first, which embeds it) and decodes one
// position. With G >= P the microbatches keep every stage busy: while stage r runs microbatch g's
// step t, stage r+1 runs g-1's. Token choice (greedy or sampled, SamplingParams) is keyed by
// (seed, sequence, step), so the tokens do not depend on P or the microbatch size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/stage_executor.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/world.h"

namespace lfm2 {

struct GenerateShape {
  int64_t n_seq = 0, seq_len = 0;  // the prompts (N, S), right-padded
  int64_t microbatch = 1;          // sequences per microbatch
  int64_t hidden = 0;
  int64_t max_new_tokens = 1;      // K
  std::vector<int32_t> lengths;    // (N) prompt lengths (empty: all S)

  int64_t n_micro() const { return (n_seq + microbatch - 1) / microbatch; }
  int64_t micro_size(int64_t g) const;
  int64_t max_len() const { return seq_len + max_new_tokens - 1; }  // cache positions per sequence
  int64_t max_item_tokens() const;
};

struct GenerateResult {
  int64_t n_new = 0;                // K
  std::vector<int32_t> generated;   // (N, K); after an EOS, that EOS id repeated
  std::vector<int32_t> n_generated; // (N) tokens up to and including the first EOS, else K
};

class GenerateJob final : public PipelineJob {
 public:
  // Allocates this stage's state and buffers through the executor (before the ready agreement).
  GenerateJob(const WorldConfig& world, StageExecutor& exec, const GenerateShape& shape, const SamplingParams& sampling);

  void set_ids(const int32_t* ids);                  // first rank: the prompts (N, S)
  void take_results(GenerateResult* result) const;  // last rank, after Pipeline::run
  // Print sequence 0's tokens as they are chosen (the last rank; one host wait per step).
  void set_stream(bool on) { stream_ = on; }
  // Run only the first `steps` steps (1: the prefill and the first token), at most max_new_tokens.
  void set_steps(int64_t steps);

  const GenerateShape& shape() const { return shape_; }

  int64_t n_items() const override { return shape_.n_micro() * steps_; }
  size_t item_bytes(int64_t i) const override;
  std::string item_name(int64_t i) const override;
  void input(int64_t i, void* x) override;
  void layers(int64_t i, void* x) override;
  void output(int64_t i, void* x) override;
  const char* input_name() const override { return "embed"; }
  const char* layers_name() const override { return "layers"; }
  const char* output_name() const override { return "choose"; }

  int64_t feedback_source(int64_t i) const override;
  bool feeds_back(int64_t i) const override;
  int feedback_slot(int64_t i) const override { return int(micro_of(i)); }
  void* feedback_buffer(int slot) override { return tokens_[size_t(slot)]; }
  size_t feedback_bytes(int64_t i) const override;

 private:
  int64_t step_of(int64_t i) const { return i / shape_.n_micro(); }
  int64_t micro_of(int64_t i) const { return i % shape_.n_micro(); }

  WorldConfig world_;
  StageExecutor& exec_;
  GenerateShape shape_;
  std::vector<int32_t> eos_;
  bool stream_ = false;
  int64_t steps_ = 1;
  int32_t* ids_ = nullptr;           // (N, S) first stage, alloc_host memory
  std::vector<int32_t*> tokens_;     // per microbatch: its last chosen tokens (first and last stage)
  int32_t* last_tokens_ = nullptr;   // the last step's tokens (fed back to nobody)
  int32_t* host_tokens_ = nullptr;   // (K, N) last stage, alloc_host memory, step-major
};

}  // namespace lfm2
