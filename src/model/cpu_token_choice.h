// The last stage's token choice on the CPU (SPEC §3 "Generation"): the defaults' sampling and the EOS
// ids, per slot the EOS id its sequence ended with, and the rule that gives an emitted row its token
// (greedy, or drawn by its sampling keyed by (seed, sequence, new token); an ended slot repeats its
// EOS id). The CUDA twin, model/cuda_token_choice.h, runs choose_emitted() here when it samples.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sample.h"
#include "model/step_batch.h"
#include "model/step_layout.h"

namespace lfm2 {

// The host's token choice for emitting rows (both backends; the GPU's sampling path): tokens[i] from
// logits row i (emits.size() rows of vocab), sampled by params[i] where given (else the defaults'
// temperature, top-k, top-p and seed), keyed by (seed, emits[i].seq, gen_step), the EOS rule on
// ended[emits[i].slot] (cpu::choose_tokens).
void choose_emitted(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
                    const SamplingParams& defaults, const SeqSampling* params, int32_t* ended, int n_threads);

struct CpuTokenChoice {
  SamplingParams sampling;     // the defaults and the EOS ids
  std::vector<int32_t> ended;  // per slot: the EOS id it produced (cpu::kNotEnded: none yet)

  // Bytes of one slot's EOS state (kept on the last stage).
  static int64_t slot_bytes(bool is_last) { return is_last ? int64_t(sizeof(int32_t)) : 0; }
  // n_slots slots, none ended.
  void allocate(int64_t n_slots, const SamplingParams& defaults);
  // The slots start new sequences (not ended).
  void restart(const std::vector<int32_t>& slots);
  // flags (n) = 1 where tokens (n) is an EOS id (cpu::finished_flags).
  void finished_flags(float* flags, const int32_t* tokens, int64_t n) const;
  // tokens (emits.size()) from their logits (emits.size(), vocab): choose_emitted() on this state;
  // params: one per emit, or null for the defaults.
  void choose(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
              const SeqSampling* params, int n_threads);
};

}  // namespace lfm2
