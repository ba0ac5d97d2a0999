// Choosing the next token from a row of logits (generation, SPEC §3): greedy argmax, or
// temperature -> top-k -> top-p -> a draw whose uniform number comes from a counter-based
// generator keyed by (seed, sequence, step), so the choice depends on nothing but the logits and
// those three numbers: not on the ranks, the microbatch or the thread that makes it.
// A sequence that has produced an end-of-sequence token keeps producing that token.
#pragma once

#include <cstdint>
#include <vector>

namespace lfm2 {

struct SamplingParams {
  float temperature = 0;     // 0: greedy (argmax, the first maximum)
  int64_t top_k = 0;         // keep the k most likely (0: all)
  float top_p = 1;           // then the smallest prefix whose probability reaches p, in (0, 1]
  uint64_t seed = 0;
  std::vector<int32_t> eos;  // end-of-sequence ids (empty: none)
  int64_t first_sequence = 0;  // the inputs' index of the job's sequence 0 (a replica's block): keys the draw
  bool greedy() const { return temperature <= 0 || top_k == 1; }
};

}  // namespace lfm2

namespace lfm2::cpu {

// tokens (n_rows); logits (n_rows, vocab) fp32 (read only); row i is sequence seq_ids[i] at
// generation step `step`. ended (one per sequence, indexed by seq_ids; kNotEnded or the EOS id the
// sequence produced) is read and set: an ended sequence repeats its own EOS id.
constexpr int32_t kNotEnded = -1;
void choose_tokens(int32_t* tokens, const float* logits, int64_t n_rows, int64_t vocab, const int64_t* seq_ids,
                   int64_t step, const SamplingParams& params, int32_t* ended, int n_threads = 1);

// flags[i] = 1 where tokens[i] is an EOS id, else 0: the sequence fed back token i has finished
// (after its first EOS the last stage repeats one), so its next decode step need not be computed.
void finished_flags(float* flags, const int32_t* tokens, int64_t n, const std::vector<int32_t>& eos);

// The uniform number in [0, 1) of (seed, sequence, step): 53 random bits.
double sampling_uniform(uint64_t seed, int64_t sequence, int64_t step);

}  // namespace lfm2::cpu
