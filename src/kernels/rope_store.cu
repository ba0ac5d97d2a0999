// The fused q/k RMSNorm + RoPE + paged KV store on the GPU (cpu::qk_norm_rope_store): one block per
// row of the step, its warps taking the q and k heads in turn as qk_norm_rope does (rope.cuh, the
// same bits), each k head also written to its page; then the block copies the row's v heads.
// A row finds its sequence by binary search over the step's PagedSeq array (ordered by row), so a
// launch covers any mix of decode rows and prefill chunks and replays from a CUDA Graph.
// fp8 cache (qk_norm_rope_store_fp8): each k head is normed and roped in place in qkv as above (its
// T values), then the same warp quantizes that row into the e4m3 pool (kv_fp8.cuh); the warps then
// take the v heads likewise.
#include <type_traits>

#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/paged_seq.cuh"
#include "kernels/kv_fp8.cuh"
#include "kernels/rope.cuh"

namespace lfm2::cuda {
namespace {

using rope_dev::kMaxPairsPerLane;

constexpr int kWarps = 8;  // a decode step has few rows (a block each): its heads 8 at a time

// KV: T (the cache in the compute dtype) or uint8_t (e4m3, scales in k_scale / v_scale).
template <typename T, typename KV>
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_store_kernel(T* qkv, KV* k_pool, KV* v_pool, float* k_scale, float* v_scale, const float* q_norm,
                              const float* k_norm, const float* inv_freq, const PagedSeq* seqs, int n_seqs,
                              const int32_t* block_table, int max_pages, int shift, int n_heads, int n_kv_heads,
                              int head_dim, float eps) {
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  const int row = int(blockIdx.x);
  const int s = find_seq(seqs, n_seqs, row);
  if (s < 0) return;
  const PagedSeq sq = seqs[s];
  if (row >= sq.row + sq.n_rows) return;  // a row of no sequence (padding)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int pos = sq.first_pos + (row - sq.row), lp = pos >> shift;
  const int page = lp < max_pages ? block_table[int64_t(sq.table_row) * max_pages + lp] : -1;
  const int64_t kv = int64_t(n_kv_heads) * head_dim;
  const int64_t dst = page < 0 ? 0 : ((int64_t(page) << shift) + (pos & ((1 << shift) - 1))) * kv;
  float cs[kMaxPairsPerLane], sn[kMaxPairsPerLane];
  rope_dev::angles(cs, sn, double(pos), inv_freq, head_dim / 2, lane);
  T* base = qkv + int64_t(row) * (int64_t(n_heads) * head_dim + 2 * kv);
  const int heads = n_heads + n_kv_heads;
  for (int h = warp; h < heads; h += kWarps) {
    T* x = base + int64_t(h) * head_dim;
    if constexpr (kF8) {
      rope_dev::norm_rope_head<T>(x, nullptr, h < n_heads ? q_norm : k_norm, cs, sn, head_dim, eps, lane);
      if (h < n_heads || page < 0) continue;
      __syncwarp();  // the row's T values, written by the warp's lanes
      const int64_t kh = h - n_heads;
      kv8::quantize_row(k_pool + dst + kh * head_dim, k_scale + dst / head_dim + kh, x, head_dim, lane);
    } else {
      T* copy = h >= n_heads && page >= 0 ? k_pool + dst + int64_t(h - n_heads) * head_dim : nullptr;
      rope_dev::norm_rope_head<T>(x, copy, h < n_heads ? q_norm : k_norm, cs, sn, head_dim, eps, lane);
    }
  }
  if (page < 0) return;
  const T* v = base + int64_t(heads) * head_dim;
  if constexpr (kF8) {
    for (int h = warp; h < n_kv_heads; h += kWarps)
      kv8::quantize_row(v_pool + dst + int64_t(h) * head_dim, v_scale + dst / head_dim + h, v + int64_t(h) * head_dim,
                        head_dim, lane);
  } else {
    for (int64_t i = threadIdx.x; i < kv; i += kWarps * 32) v_pool[dst + i] = v[i];
  }
}

template <typename T, typename KV>
void launch_store(T* qkv, KV* k_pool, KV* v_pool, float* k_scale, float* v_scale, const float* q_norm,
                  const float* k_norm, const float* inv_freq, const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows,
                  const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, float eps, cudaStream_t stream) {
  LFM2_CHECK(valid_page_size(page_size), "qk_norm_rope_store: page size ", page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  LFM2_CHECK(head_dim % 2 == 0 && head_dim <= 64 * kMaxPairsPerLane, "qk_norm_rope_store: head_dim ", head_dim,
             " must be even and <= ", 64 * kMaxPairsPerLane);
  LFM2_CHECK(n_rows < (int64_t(1) << 31) && n_seqs < (int64_t(1) << 31) && max_pages * page_size <= (int64_t(1) << 31),
             "qk_norm_rope_store: ", n_rows, " rows, ", n_seqs, " sequences, ", max_pages, " pages of ", page_size,
             " (positions and rows must fit int32)");
  if (n_rows == 0 || n_seqs == 0) return;
  qk_norm_rope_store_kernel<T, KV><<<unsigned(n_rows), kWarps * 32, 0, stream>>>(
      qkv, k_pool, v_pool, k_scale, v_scale, q_norm, k_norm, inv_freq, seqs, int(n_seqs), block_table, int(max_pages),
      page_shift(page_size), int(n_heads), int(n_kv_heads), int(head_dim), eps);
  CUDA_CHECK_LAUNCH("qk_norm_rope_store_kernel");
}

}  // namespace

template <typename T>
void qk_norm_rope_store(T* qkv, T* k_pool, T* v_pool, const float* q_norm, const float* k_norm, const float* inv_freq,
                        const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows, const int32_t* block_table,
                        int64_t max_pages, int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                        float eps, cudaStream_t stream) {
  launch_store<T, T>(qkv, k_pool, v_pool, nullptr, nullptr, q_norm, k_norm, inv_freq, seqs, n_seqs, n_rows,
                     block_table, max_pages, page_size, n_heads, n_kv_heads, head_dim, eps, stream);
}

template <typename T>
void qk_norm_rope_store_fp8(T* qkv, uint8_t* k_pool, uint8_t* v_pool, float* k_scale, float* v_scale,
                            const float* q_norm, const float* k_norm, const float* inv_freq, const PagedSeq* seqs,
                            int64_t n_seqs, int64_t n_rows, const int32_t* block_table, int64_t max_pages,
                            int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                            cudaStream_t stream) {
  launch_store<T, uint8_t>(qkv, k_pool, v_pool, k_scale, v_scale, q_norm, k_norm, inv_freq, seqs, n_seqs, n_rows,
                           block_table, max_pages, page_size, n_heads, n_kv_heads, head_dim, eps, stream);
}

#define INST(T)                                                                                                    \
  template void qk_norm_rope_store<T>(T*, T*, T*, const float*, const float*, const float*, const PagedSeq*,        \
                                      int64_t, int64_t, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                      float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST
#define INST(T)                                                                                                    \
  template void qk_norm_rope_store_fp8<T>(T*, uint8_t*, uint8_t*, float*, float*, const float*, const float*,      \
                                          const float*, const PagedSeq*, int64_t, int64_t, const int32_t*, int64_t, \
                                          int64_t, int64_t, int64_t, int64_t, float, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
