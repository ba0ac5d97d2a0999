// Attention of a step's rows over their sequences' paged KV caches (paged_kv.h): row i of a
// sequence (position first_pos + i) sees cache positions 0 .. first_pos + i of that sequence
// (causal; the step's own k and v already stored there). One twin for both GPU ops,
// cuda::attention_decode_paged (one row per sequence) and cuda::attention_prefill_paged (chunks).
// The same loops as cpu::attention (scores, max, exp, sum, weighted sum, in that order, fp32), so a
// row gets its bits whatever the page placement, the page size, the chunking of its prompt or the
// other rows of the step.
#pragma once

#include <cstdint>

#include "kernels/paged_kv.h"

namespace lfm2::cpu {

// Floats of scratch attention_paged() needs for caches of up to max_len positions.
int64_t attention_paged_scratch_floats(int64_t max_len, int n_threads);

// out (rows of n_heads * head_dim, the rows of seqs: out row r is q row r); q rows of q_stride
// floats (0: n_heads * head_dim), heads at h * head_dim; k_pool, v_pool [n_pages, page_size,
// n_kv_heads, head_dim]; block_table [.., max_pages]; scratch of
// attention_paged_scratch_floats(max_pages * page_size, n_threads) floats. Rows of no sequence are
// left alone.
void attention_paged(float* out, const float* q, const float* k_pool, const float* v_pool, const PagedSeq* seqs,
                     int64_t n_seqs, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch,
                     int n_threads = 1, int64_t q_stride = 0);

}  // namespace lfm2::cpu
