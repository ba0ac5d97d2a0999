// Embedding lookup on the CPU: a row copy per token.
#include "kernels/embedding.h"

#include <cstring>

#include "common/error.h"
#include "common/parallel.h"

namespace lfm2::cpu {

void embedding(float* out, const int32_t* ids, const float* table, int64_t n_tokens, int64_t vocab, int64_t hidden,
               int n_threads) {
  for (int64_t t = 0; t < n_tokens; ++t)
    LFM2_CHECK(ids[t] >= 0 && ids[t] < vocab, "embedding: token id ", ids[t], " at position ", t,
               " outside [0, ", vocab, ")");
  parallel_for(n_tokens, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t)
      std::memcpy(out + t * hidden, table + int64_t(ids[t]) * hidden, size_t(hidden) * sizeof(float));
  }, 256);
}

}  // namespace lfm2::cpu
