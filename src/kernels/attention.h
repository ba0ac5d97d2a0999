// Causal grouped-query attention over a block of n_seq independent sequences of seq_len tokens
// (row = s * seq_len + t; token t of a sequence sees tokens 0..t of the same sequence):
//   o[t, h] = softmax_j(q[t, h] . k[j, h / (n_heads / n_kv_heads)] * scale) v[j, ...]
// As HF eager attention: scores in fp32, softmax as exp(s - max) / sum in fp32, then p v in fp32.
// Memory: one row of seq_len scores per thread (scratch), O(S) not O(S^2).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// Floats of scratch attention() needs for n_threads (0: hardware concurrency).
int64_t attention_scratch_floats(int64_t seq_len, int n_threads);

// out, q (n_seq * seq_len, n_heads * head_dim); k, v (n_seq * seq_len, n_kv_heads * head_dim);
// n_heads a multiple of n_kv_heads; scratch of attention_scratch_floats(seq_len, n_threads) floats.
void attention(float* out, const float* q, const float* k, const float* v, int64_t n_seq, int64_t seq_len,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch,
               int n_threads = 1);

}  // namespace lfm2::cpu
