// Chunked-prefill attention over a paged KV cache (cpu::attention_paged): the n_rows queries of each
// sequence's chunk (positions first_pos .. first_pos + n_rows - 1, their k and v already stored)
// against that sequence's cache positions 0 .. their own, causal, several sequences in one launch.
//
// bf16 / fp16: tensor cores, attention.cu's FlashAttention-2 structure with GQA packing. A block of
// 4 warps owns 128 mma rows (head_dim <= 64; 64 rows at 128) = rows / group consecutive queries x
// the group's query heads of one KV head (row r: query r / group, head r % group), so each K/V tile
// serves every head of the group; its Q rows stay in registers as mma fragments, 32 rows a warp (two
// m16 tiles sharing every K / V fragment it loads). Key/value tiles of 64 positions, aligned to absolute
// position 0, stream through shared memory (cp.async double buffer, 16-byte copies through the block
// table, positions past the chunk zero-filled); S = Q K^T and O += P V as m16n8k16 mma, online
// softmax in fp32, P rounded to the element type for P V. Every row sees the same tiles in the same
// order with the same arithmetic as attention.cu's kernel, and a tile wholly past a row's position
// leaves its state bit for bit unchanged, so a row's bits depend neither on the chunk size nor on
// the other rows or sequences (a whole prompt in one chunk gives attention()'s bits).
// fp32: exact SIMT FMAs, one query row per thread as attention.cu's fp32 kernel, tiles aligned the
// same way and each tile through the same function (attention_simt.cuh).
//
// fp8 cache (attention_prefill_paged_fp8, bf16 / fp16): the double buffer holds e4m3 tiles and their
// rows' scales; each landed tile is widened into one T tile (kv_fp8.cuh, as the decode kernel) and
// the warps compute on it as on a T cache.
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_prefill_tc.cuh"
#include "kernels/attention_simt.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/kv_fp8.cuh"

namespace lfm2::cuda {
namespace {

using namespace mma;
using namespace prefill;  // kBKV, kWarps, kThreads, PrefillSmem, PrefillRows, PrefillBlock

constexpr int kBQ = 64;  // the fp32 kernel's rows a block

// KV: T, or uint8_t for an fp8 cache (k_scale, v_scale its scale pools; null otherwise).
template <typename T, int HD, int MT, typename KV = T>
__global__ void __launch_bounds__(kThreads)
    prefill_tc_kernel(T* out, const T* q, const KV* k_pool, const KV* v_pool, const float* k_scale,
                      const float* v_scale, const PagedSeq* seqs, int n_seqs, const int32_t* block_table,
                      int max_pages, int shift, int n_heads, int n_kv, int group, int n_qtiles, int64_t q_stride,
                      float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // blocks numbered (reversed query tile, sequence, KV head): the later, heavier tiles first
  const int per_tile = n_seqs * n_kv;
  const int qt = n_qtiles - 1 - int(blockIdx.x) / per_tile;
  const int si = (int(blockIdx.x) % per_tile) / n_kv, kvh = int(blockIdx.x) % n_kv;
  const PagedSeq seq = seqs[si];
  const int qpb = PrefillSmem<HD, MT>::kRows / group, i0 = qt * qpb;  // queries per block, the block's first
  if (i0 >= seq.n_rows) return;
  const PrefillRows br{seq, kvh, group, i0, min(qpb, seq.n_rows - i0)};
  const PagedRows rows{block_table + int64_t(seq.table_row) * max_pages, shift, n_kv * HD};
  PrefillBlock<T, HD, MT, KV> block(smem_raw, br, rows, k_pool, v_pool, k_scale, v_scale, n_kv);
  block.load_q(q, q_stride);
  block.run(scale_log2);
  block.write_out(out, n_heads);
}

// fp32: one query row per thread (64 per block) of one (sequence, head), key tiles staged as fp32.
template <int HD>
__global__ void __launch_bounds__(kBQ)
    prefill_simt_kernel(float* out, const float* q, const float* k_pool, const float* v_pool, const PagedSeq* seqs,
                        int n_seqs, const int32_t* block_table, int max_pages, int shift, int n_heads, int n_kv,
                        int group, int n_qtiles, int64_t q_stride, float scale_log2) {
  constexpr int kKeys = HD <= 64 ? 32 : 16;  // keys per tile
  __shared__ __align__(16) float ks[kKeys][HD];
  __shared__ __align__(16) float vs[kKeys][HD];

  const int per_tile = n_seqs * n_heads;
  const int qt = n_qtiles - 1 - int(blockIdx.x) / per_tile;
  const int si = (int(blockIdx.x) % per_tile) / n_heads, h = int(blockIdx.x) % n_heads, kvh = h / group;
  const PagedSeq seq = seqs[si];
  const int i0 = qt * kBQ;
  if (i0 >= seq.n_rows) return;
  const int i = i0 + int(threadIdx.x), k_end = seq.first_pos + min(seq.n_rows, i0 + kBQ);
  const bool valid = i < seq.n_rows;
  const int qpos = seq.first_pos + i;
  const PagedRows rows{block_table + int64_t(seq.table_row) * max_pages, shift, n_kv * HD};

  float qr[HD], o[HD];
  const float* qp = q + int64_t(seq.row + (valid ? i : 0)) * q_stride + int64_t(h) * HD;
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    qr[d] = valid ? qp[d] * scale_log2 : 0.f;
    o[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    for (int e = threadIdx.x; e < kKeys * HD; e += kBQ) {
      const int j = e / HD, d = e - j * HD, kp = k0 + j;
      const int64_t off = kp < k_end ? rows.offset(kp) + int64_t(kvh) * HD + d : -1;
      ks[j][d] = off >= 0 ? k_pool[off] : 0.f;
      vs[j][d] = off >= 0 ? v_pool[off] : 0.f;
    }
    __syncthreads();
    simt_key_tile(ks, vs, qr, o, m, l, k0, qpos);
  }
  if (!valid) return;
  const float inv = 1.f / l;
  float* op = out + int64_t(seq.row + i) * n_heads * HD + int64_t(h) * HD;
#pragma unroll
  for (int d = 0; d < HD; ++d) op[d] = o[d] * inv;
}

struct PrefillArgs {
  const PagedSeq* seqs;
  int64_t n_seqs, max_rows;
  const int32_t* block_table;
  int64_t max_pages, page_size, n_heads, n_kv_heads;
  float scale;
  int64_t q_stride;
  const float *k_scale = nullptr, *v_scale = nullptr;  // an fp8 cache's scale pools
};

// The tensor-core kernel's rows per warp: 32 (two row tiles) for head_dim <= 64, where the
// registers allow; LFM2_PREFILL_WARP_ROWS=16 gives the one-tile kernel back (tuning only: both give
// the same bits, every row seeing the same tiles with the same arithmetic).
int rows_per_warp() {
  static const int r = env_choice("LFM2_PREFILL_WARP_ROWS", "32", {"16", "32"}) == "16" ? 16 : 32;
  return r;
}

template <typename T, int HD, int MT, typename KV = T>
void launch_tc(T* out, const T* q, const KV* k_pool, const KV* v_pool, const PrefillArgs& a, cudaStream_t stream) {
  const int shift = page_shift(a.page_size), group = int(a.n_heads / a.n_kv_heads);
  const float scale_log2 = a.scale * 1.4426950408889634f;
  using S = PrefillSmem<HD, MT, std::is_same<KV, uint8_t>::value>;
  const int64_t qpb = S::kRows / group, n_qtiles = (a.max_rows + qpb - 1) / qpb;
  const int64_t blocks = n_qtiles * a.n_seqs * a.n_kv_heads;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "attention_prefill_paged: ", blocks, " blocks is too many for one launch");
  auto kernel = prefill_tc_kernel<T, HD, MT, KV>;
  if (S::kBytes > (size_t(48) << 10)) raise_smem_limit(reinterpret_cast<const void*>(kernel), int(S::kBytes));
  kernel<<<unsigned(blocks), kThreads, S::kBytes, stream>>>(
      out, q, k_pool, v_pool, a.k_scale, a.v_scale, a.seqs, int(a.n_seqs), a.block_table, int(a.max_pages), shift,
      int(a.n_heads), int(a.n_kv_heads), group, int(n_qtiles), a.q_stride, scale_log2);
  CUDA_CHECK_LAUNCH("prefill_tc_kernel");
}

template <typename T, int HD>
void launch_prefill(T* out, const T* q, const T* k_pool, const T* v_pool, const PrefillArgs& a, cudaStream_t stream) {
  const int shift = page_shift(a.page_size), group = int(a.n_heads / a.n_kv_heads);
  const float scale_log2 = a.scale * 1.4426950408889634f;
  if constexpr (std::is_same<T, float>::value) {
    const int64_t n_qtiles = (a.max_rows + kBQ - 1) / kBQ, blocks = n_qtiles * a.n_seqs * a.n_heads;
    LFM2_CHECK(blocks < (int64_t(1) << 31), "attention_prefill_paged: ", blocks, " blocks is too many for one launch");
    prefill_simt_kernel<HD><<<unsigned(blocks), kBQ, 0, stream>>>(
        out, q, k_pool, v_pool, a.seqs, int(a.n_seqs), a.block_table, int(a.max_pages), shift, int(a.n_heads),
        int(a.n_kv_heads), group, int(n_qtiles), a.q_stride, scale_log2);
    CUDA_CHECK_LAUNCH("prefill_simt_kernel");
  } else {
    if (HD <= 64 && rows_per_warp() == 32) return launch_tc<T, HD, HD <= 64 ? 2 : 1>(out, q, k_pool, v_pool, a, stream);
    launch_tc<T, HD, 1>(out, q, k_pool, v_pool, a, stream);
  }
}

template <typename T, int HD>
void launch_prefill_fp8(T* out, const T* q, const uint8_t* k_pool, const uint8_t* v_pool, const PrefillArgs& a,
                        cudaStream_t stream) {
  if (HD <= 64 && rows_per_warp() == 32)
    return launch_tc<T, HD, HD <= 64 ? 2 : 1, uint8_t>(out, q, k_pool, v_pool, a, stream);
  launch_tc<T, HD, 1, uint8_t>(out, q, k_pool, v_pool, a, stream);
}

// The kernel for head_dim HD: the T cache's or (KV = uint8_t) the fp8 one's.
template <typename T, int HD, typename KV>
void launch_prefill_kv(T* out, const T* q, const KV* k_pool, const KV* v_pool, const PrefillArgs& a,
                       cudaStream_t stream) {
  if constexpr (std::is_same<KV, uint8_t>::value)
    launch_prefill_fp8<T, HD>(out, q, k_pool, v_pool, a, stream);
  else
    launch_prefill<T, HD>(out, q, k_pool, v_pool, a, stream);
}

// Both entries, the T cache (KV = T) and the fp8 one (KV = uint8_t, a's scale pools): the arguments
// checked in one line naming the entry, then the kernel for head_dim.
template <typename T, typename KV>
void prefill_entry(const char* name, T* out, const T* q, const KV* k_pool, const KV* v_pool, PrefillArgs a,
                   int64_t head_dim, cudaStream_t stream) {
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  LFM2_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.n_heads / a.n_kv_heads <= kBQ, name, ": ",
             a.n_heads, " heads over ", a.n_kv_heads, " kv heads (a multiple, at most ", kBQ, " per kv head)");
  LFM2_CHECK(valid_page_size(a.page_size), name, ": page size ", a.page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  LFM2_CHECK(a.max_pages * a.page_size <= (int64_t(1) << 31) && a.max_rows < (int64_t(1) << 31), name, ": ",
             a.max_pages, " pages of ", a.page_size, ", ", a.max_rows, " rows (positions and rows must fit int32)");
  if (a.q_stride == 0) a.q_stride = a.n_heads * head_dim;
  if (!std::is_same<T, float>::value)
    LFM2_CHECK(aligned16(q) && aligned16(k_pool) && aligned16(v_pool) && aligned16(out) &&
                   (a.q_stride * int64_t(sizeof(T))) % 16 == 0 && (!kF8 || (a.k_scale && a.v_scale)),
               name, ": 16-bit q, out and the pools must be 16-byte aligned, q rows a multiple of 16 bytes",
               kF8 ? ", the scale pools given" : "");
  if (a.n_seqs == 0 || a.max_rows == 0) return;
  switch (head_dim) {
    case 16: return launch_prefill_kv<T, 16>(out, q, k_pool, v_pool, a, stream);
    case 32: return launch_prefill_kv<T, 32>(out, q, k_pool, v_pool, a, stream);
    case 64: return launch_prefill_kv<T, 64>(out, q, k_pool, v_pool, a, stream);
    case 128: return launch_prefill_kv<T, 128>(out, q, k_pool, v_pool, a, stream);
    default: LFM2_FAIL(name, ": head_dim ", head_dim, " not supported (16, 32, 64 or 128)");
  }
}

}  // namespace

template <typename T>
void attention_prefill_paged(T* out, const T* q, const T* k_pool, const T* v_pool, const PagedSeq* seqs,
                             int64_t n_seqs, int64_t max_rows, const int32_t* block_table, int64_t max_pages,
                             int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                             cudaStream_t stream, int64_t q_stride) {
  prefill_entry("attention_prefill_paged", out, q, k_pool, v_pool,
                PrefillArgs{seqs, n_seqs, max_rows, block_table, max_pages, page_size, n_heads, n_kv_heads, scale,
                            q_stride},
                head_dim, stream);
}

template <typename T>
void attention_prefill_paged_fp8(T* out, const T* q, const uint8_t* k_pool, const uint8_t* v_pool,
                                 const float* k_scale, const float* v_scale, const PagedSeq* seqs, int64_t n_seqs,
                                 int64_t max_rows, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                 cudaStream_t stream, int64_t q_stride) {
  PrefillArgs a{seqs, n_seqs, max_rows, block_table, max_pages, page_size, n_heads, n_kv_heads, scale, q_stride};
  a.k_scale = k_scale, a.v_scale = v_scale;
  prefill_entry("attention_prefill_paged_fp8", out, q, k_pool, v_pool, a, head_dim, stream);
}

#define INST(T)                                                                                                  \
  template void attention_prefill_paged<T>(T*, const T*, const T*, const T*, const PagedSeq*, int64_t, int64_t, \
                                           const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float,   \
                                           cudaStream_t, int64_t);
LFM2_FOR_EACH_T(INST)
#undef INST
#define INST(T)                                                                                                  \
  template void attention_prefill_paged_fp8<T>(T*, const T*, const uint8_t*, const uint8_t*, const float*,      \
                                               const float*, const PagedSeq*, int64_t, int64_t, const int32_t*, \
                                               int64_t, int64_t, int64_t, int64_t, int64_t, float, cudaStream_t, \
                                               int64_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
