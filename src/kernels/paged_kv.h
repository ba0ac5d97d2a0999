// The paged KV cache (issues 20 and 26) and the per-sequence description of a step's rows, shared
// by the store (rope_store.h) and the attention kernels (attention_paged.h) on both backends.
//
// Layout, per attention layer: a K pool and a V pool of fixed-size pages in the compute dtype,
//   k_pool, v_pool   [n_pages, page_size, n_kv_heads, head_dim]
// so that cache position p of a sequence whose block-table row is r lives at
//   page = block_table[r * max_pages + p / page_size], slot = p % page_size,
//   k_pool[((page * page_size + slot) * n_kv_heads + kv_head) * head_dim + d].
// Why this order: a position's k (all KV heads) is one contiguous row, as the qkv rows that the
// store copies from, so a store writes whole rows; the attention kernels read 16-byte pieces of
// head_dim (a 64-dim bf16 head is one 128-byte line) and schedule the KV heads of one position
// range side by side, so the lines of a row are fetched together. A contiguous cache
// (n_seq, max_len, n_kv_heads * head_dim) is this pool with sequence s on pages
// s * m .. s * m + m - 1 (m = max_len / page_size): a table of one run of consecutive pages.
//
// block_table int32 [n_table_rows, max_pages] on the device: fixed width, so one CUDA Graph per batch
// shape replays every step (the caller rewrites the table and the PagedSeq array before a replay).
// Entries past a sequence's length are never read; the store skips a row whose entry is negative.
// page_size: a power of two from 16 to 2^16 (kernels compute with it only in the address, so a row's
// bits do not depend on it); positions fit in int32, and a pool holds fewer than 2^31 positions
// (n_pages * page_size: the kernels compute a pool row in 32 bits).
//
// FP8 cache (--kv-dtype fp8, docs/fp8.md "KV cache"): the pools hold e4m3 bytes in the same layout,
//   k_pool, v_pool   uint8 [n_pages, page_size, n_kv_heads, head_dim]
//   k_scale, v_scale fp32  [n_pages, page_size, n_kv_heads]   (paged_scale_offset)
// and a stored row x (one position's head_dim values of one KV head: k after the norm and RoPE, v
// as projected, each first rounded to the compute dtype T as the T cache stores it) is
// s = amax|x| / 448 (amax 0: s = 1), q = e4m3(x / s) (round to nearest even, saturating: the codec of
// common/fp8.h); it reads as q * s. A row's bits depend on that row alone, so an fp8 cache keeps
// every independence above. The CPU backend keeps fp32 pools holding q * s (exact in fp32).
#pragma once

#include <cstdint>

namespace lfm2 {

// One sequence's rows in a step (device array, one entry per sequence, ordered by `row`):
// rows row .. row + n_rows - 1 of the step's buffers (qkv rows, attention output rows) are its
// positions first_pos .. first_pos + n_rows - 1. A decode row: n_rows 1 at position len - 1; a
// prefill chunk: n rows from first_pos (0 for a whole prompt). Once the step's k and v are
// stored, the sequence's cache holds positions 0 .. first_pos + n_rows - 1.
struct PagedSeq {
  int32_t row;        // first row in the step's buffers
  int32_t n_rows;     // >= 1
  int32_t first_pos;  // cache position of its first row
  int32_t table_row;  // its row of the block table
};
static_assert(sizeof(PagedSeq) == 16, "PagedSeq is four int32 (uploaded as raw bytes)");

constexpr int64_t kMinPageSize = 16, kMaxPageSize = int64_t(1) << 16;

inline bool valid_page_size(int64_t page_size) {
  return page_size >= kMinPageSize && page_size <= kMaxPageSize && (page_size & (page_size - 1)) == 0;
}

inline int page_shift(int64_t page_size) {
  int s = 0;
  while ((int64_t(1) << s) < page_size) ++s;
  return s;
}

// Element offset of (page, slot, kv_head) in a pool: the first of its head_dim elements.
inline int64_t paged_offset(int64_t page, int64_t slot, int64_t kv_head, int64_t page_size, int64_t n_kv_heads,
                            int64_t head_dim) {
  return ((page * page_size + slot) * n_kv_heads + kv_head) * head_dim;
}

// Index of (page, slot, kv_head)'s scale in an fp8 cache's scale pool.
inline int64_t paged_scale_offset(int64_t page, int64_t slot, int64_t kv_head, int64_t page_size,
                                  int64_t n_kv_heads) {
  return (page * page_size + slot) * n_kv_heads + kv_head;
}

}  // namespace lfm2
