// Causal GQA attention on the CPU: one (sequence, head, query) row per work item (attend_row_cpu.h),
// the scores kept in a per-thread row of scratch.
#include "kernels/attention.h"

#include "common/error.h"
#include "common/parallel.h"
#include "kernels/attend_row_cpu.h"

namespace lfm2::cpu {

int64_t attention_scratch_floats(int64_t seq_len, int n_threads) { return seq_len * resolve_threads(n_threads); }

void attention(float* out, const float* q, const float* k, const float* v, int64_t n_seq, int64_t seq_len,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* scratch,
               int n_threads) {
  LFM2_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: ", n_heads, " heads not a multiple of ",
             n_kv_heads, " kv heads");
  const int64_t group = n_heads / n_kv_heads;
  const int64_t q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
  const int64_t n_items = n_seq * n_heads * seq_len;
  parallel_for(n_items, n_threads, [&](int64_t b, int64_t e, int worker) {
    float* p = scratch + int64_t(worker) * seq_len;
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item % seq_len, h = (item / seq_len) % n_heads, s = item / (seq_len * n_heads);
      const int64_t row0 = s * seq_len, kvh = h / group;
      attend_row(out + (row0 + t) * q_stride + h * head_dim, q + (row0 + t) * q_stride + h * head_dim,
                 k + row0 * kv_stride + kvh * head_dim, v + row0 * kv_stride + kvh * head_dim,
                 [&](int64_t j) { return j * kv_stride; }, t, head_dim, scale, p);
    }
  }, 4);
}

}  // namespace lfm2::cpu
