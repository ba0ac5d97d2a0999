// The fused q/k norm + RoPE + paged store on the CPU, composed from the CPU ops row by row.
#include "kernels/rope_store.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/fp8.h"
#include "common/parallel.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace lfm2::cpu {
namespace {

void store(float* qkv, float* k_pool, float* v_pool, const float* q_norm, const float* k_norm, const float* inv_freq,
           const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows, const int32_t* block_table, int64_t max_pages,
           int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps, int n_threads,
           bool fp8) {
  LFM2_CHECK(valid_page_size(page_size), "qk_norm_rope_store: page size ", page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  const int64_t width = (n_heads + 2 * n_kv_heads) * head_dim, kv = n_kv_heads * head_dim;
  std::vector<int64_t> row_seq(size_t(n_rows), -1);  // the sequence of each row
  for (int64_t s = 0; s < n_seqs; ++s) {
    const PagedSeq& q = seqs[s];
    LFM2_CHECK(q.row >= 0 && q.n_rows >= 1 && q.row + int64_t(q.n_rows) <= n_rows && q.first_pos >= 0,
               "qk_norm_rope_store: sequence ", s, " has rows ", q.row, " + ", q.n_rows, " at ", q.first_pos,
               " outside the step's ", n_rows, " rows");
    const int64_t last = int64_t(q.first_pos) + q.n_rows - 1;
    LFM2_CHECK(last / page_size < max_pages, "qk_norm_rope_store: sequence ", s, " reaches position ", last,
               ", past the ", max_pages, " pages of ", page_size, " of a table row");
    for (int64_t lp = q.first_pos / page_size; lp <= last / page_size; ++lp)
      LFM2_CHECK(block_table[q.table_row * max_pages + lp] >= 0, "qk_norm_rope_store: sequence ", s,
                 " has no page for positions from ", lp * page_size, " (table row ", q.table_row, ")");
    for (int64_t r = q.row; r < q.row + q.n_rows; ++r) row_seq[size_t(r)] = s;
  }
  parallel_for(n_rows, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      if (row_seq[size_t(r)] < 0) continue;
      const PagedSeq& q = seqs[row_seq[size_t(r)]];
      const int64_t pos = q.first_pos + (r - q.row);
      const int64_t page = block_table[q.table_row * max_pages + pos / page_size];
      float* x = qkv + r * width;
      float* k = x + n_heads * head_dim;
      rmsnorm(x, x, q_norm, n_heads, head_dim, eps);
      rmsnorm(k, k, k_norm, n_kv_heads, head_dim, eps);
      rope(x, x, &pos, inv_freq, 1, n_heads, head_dim);
      rope(k, k, &pos, inv_freq, 1, n_kv_heads, head_dim);
      const int64_t dst = paged_offset(page, pos % page_size, 0, page_size, n_kv_heads, head_dim);
      std::copy(k, k + kv, k_pool + dst);
      std::copy(k + kv, k + 2 * kv, v_pool + dst);
      if (fp8) {  // per (position, KV head): the rows of head_dim values
        fp8_fake_quantize_rows(k_pool + dst, n_kv_heads, head_dim, head_dim);
        fp8_fake_quantize_rows(v_pool + dst, n_kv_heads, head_dim, head_dim);
      }
    }
  }, 16);
}

}  // namespace

void qk_norm_rope_store(float* qkv, float* k_pool, float* v_pool, const float* q_norm, const float* k_norm,
                        const float* inv_freq, const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows,
                        const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                        int64_t n_kv_heads, int64_t head_dim, float eps, int n_threads) {
  store(qkv, k_pool, v_pool, q_norm, k_norm, inv_freq, seqs, n_seqs, n_rows, block_table, max_pages, page_size,
        n_heads, n_kv_heads, head_dim, eps, n_threads, false);
}

void qk_norm_rope_store_fp8(float* qkv, float* k_pool, float* v_pool, const float* q_norm, const float* k_norm,
                            const float* inv_freq, const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows,
                            const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float eps, int n_threads) {
  store(qkv, k_pool, v_pool, q_norm, k_norm, inv_freq, seqs, n_seqs, n_rows, block_table, max_pages, page_size,
        n_heads, n_kv_heads, head_dim, eps, n_threads, true);
}

}  // namespace lfm2::cpu
