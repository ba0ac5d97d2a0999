// The attention layer's per-row prologue on a paged cache (paged_kv.h), fused: for each row of each
// sequence of a step, per-head RMSNorm of its q and k heads (HF q_layernorm / k_layernorm), RoPE at
// the row's position (rope.h), in place on the [q | k | v] row, and then its k and v stored in the
// pools at that position. Equal to cpu::rmsnorm(q), cpu::rmsnorm(k), cpu::rope(q), cpu::rope(k) and
// the copies into the cache, in the CPU stage's order.
#pragma once

#include <cstdint>

#include "kernels/paged_kv.h"

namespace lfm2::cpu {

// qkv (n_rows, (n_heads + 2 * n_kv_heads) * head_dim), rows [q | k | v], updated in place (q and k);
// k_pool, v_pool [n_pages, page_size, n_kv_heads, head_dim]; q_norm, k_norm (head_dim);
// inv_freq (head_dim / 2) from rope_inv_freq; seqs (n_seqs) ordered by row, their rows < n_rows;
// block_table [.., max_pages]. Rows of no sequence are left alone. A position past the table or a
// negative table entry is an error here, raised before anything is written (the GPU skips such a
// row's store).
void qk_norm_rope_store(float* qkv, float* k_pool, float* v_pool, const float* q_norm, const float* k_norm,
                        const float* inv_freq, const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows,
                        const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                        int64_t n_kv_heads, int64_t head_dim, float eps, int n_threads = 1);

// The same with an fp8 cache (paged_kv.h): each stored head row of k and v is e4m3(x / s) * s, s =
// amax / 448 of the row (fp8_fake_quantize_rows), in the fp32 pools; qkv is left as above. The twin
// of cuda::qk_norm_rope_store_fp8, whose pools hold the e4m3 bytes and the scales.
void qk_norm_rope_store_fp8(float* qkv, float* k_pool, float* v_pool, const float* q_norm, const float* k_norm,
                            const float* inv_freq, const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows,
                            const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float eps, int n_threads = 1);

}  // namespace lfm2::cpu
