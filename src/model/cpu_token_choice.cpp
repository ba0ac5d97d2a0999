#include "model/cpu_token_choice.h"

#include "common/parallel.h"

namespace lfm2 {

void choose_emitted(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
                    const SamplingParams& defaults, const SeqSampling* params, int32_t* ended, int n_threads) {
  parallel_for(int64_t(emits.size()), n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const StepEmit& em = emits[size_t(i)];
      SamplingParams p = defaults;
      if (params) {
        p.temperature = params[i].temperature;
        p.top_k = params[i].top_k;
        p.top_p = params[i].top_p;
        p.seed = params[i].seed;
      }
      p.first_sequence = em.seq - em.slot;  // the draw is keyed by first_sequence + slot = seq
      const int64_t slot = em.slot;
      cpu::choose_tokens(tokens + i, logits + i * vocab, 1, vocab, &slot, em.gen_step, p, ended, 1);
    }
  }, 1);
}

void CpuTokenChoice::allocate(int64_t n_slots, const SamplingParams& defaults) {
  sampling = defaults;
  ended.assign(size_t(n_slots), cpu::kNotEnded);
}

void CpuTokenChoice::restart(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) ended[size_t(s)] = cpu::kNotEnded;
}

void CpuTokenChoice::finished_flags(float* flags, const int32_t* tokens, int64_t n) const {
  cpu::finished_flags(flags, tokens, n, sampling.eos);
}

void CpuTokenChoice::choose(int32_t* tokens, const float* logits, int64_t vocab, const std::vector<StepEmit>& emits,
                            const SeqSampling* params, int n_threads) {
  choose_emitted(tokens, logits, vocab, emits, sampling, params, ended.data(), n_threads);
}

}  // namespace lfm2
