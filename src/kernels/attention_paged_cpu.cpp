// Paged attention on the CPU: one (row, head) per work item, attention_cpu.cpp's row (attend_row_cpu.h)
// over the positions' pages, the scores kept in a per-thread row of scratch.
#include "kernels/attention_paged.h"

#include <utility>
#include <vector>

#include "common/error.h"
#include "common/parallel.h"
#include "kernels/attend_row_cpu.h"

namespace lfm2::cpu {

int64_t attention_paged_scratch_floats(int64_t max_len, int n_threads) { return max_len * resolve_threads(n_threads); }

void attention_paged(float* out, const float* q, const float* k_pool, const float* v_pool, const PagedSeq* seqs,
                     int64_t n_seqs, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch,
                     int n_threads, int64_t q_stride) {
  LFM2_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention_paged: ", n_heads, " heads not a multiple of ",
             n_kv_heads, " kv heads");
  LFM2_CHECK(valid_page_size(page_size), "attention_paged: page size ", page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  const int64_t group = n_heads / n_kv_heads, max_len = max_pages * page_size;
  if (q_stride == 0) q_stride = n_heads * head_dim;
  std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence, row within it)
  for (int64_t s = 0; s < n_seqs; ++s) {
    const PagedSeq& sq = seqs[s];
    LFM2_CHECK(sq.n_rows >= 1 && sq.first_pos >= 0 && int64_t(sq.first_pos) + sq.n_rows <= max_len,
               "attention_paged: sequence ", s, " has positions ", sq.first_pos, " + ", sq.n_rows,
               " outside a cache of ", max_len);
    for (int64_t lp = 0; lp * page_size < int64_t(sq.first_pos) + sq.n_rows; ++lp)
      LFM2_CHECK(block_table[sq.table_row * max_pages + lp] >= 0, "attention_paged: sequence ", s,
                 " has no page for positions from ", lp * page_size);
    for (int64_t i = 0; i < sq.n_rows; ++i) rows.emplace_back(s, i);
  }
  parallel_for(int64_t(rows.size()) * n_heads, n_threads, [&](int64_t b, int64_t e, int worker) {
    float* p = scratch + int64_t(worker) * max_len;
    for (int64_t item = b; item < e; ++item) {
      const auto [s, i] = rows[size_t(item / n_heads)];
      const int64_t h = item % n_heads, kvh = h / group;
      const PagedSeq& sq = seqs[s];
      const int32_t* table = block_table + sq.table_row * max_pages;
      auto row_of = [&](int64_t j) {
        return paged_offset(table[j / page_size], j % page_size, kvh, page_size, n_kv_heads, head_dim);
      };
      const int64_t r = sq.row + i;
      attend_row(out + r * n_heads * head_dim + h * head_dim, q + r * q_stride + h * head_dim, k_pool, v_pool,
                 row_of, sq.first_pos + i, head_dim, scale, p);
    }
  }, 4);
}

}  // namespace lfm2::cpu
