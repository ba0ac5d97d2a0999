// Embedding lookup: out[t] = table[ids[t]].
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out (n_tokens, hidden); ids (n_tokens); table (vocab, hidden). Throws on an id outside [0, vocab).
void embedding(float* out, const int32_t* ids, const float* table, int64_t n_tokens, int64_t vocab, int64_t hidden,
               int n_threads = 1);

}  // namespace lfm2::cpu
