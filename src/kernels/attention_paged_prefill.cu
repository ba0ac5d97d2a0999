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
// same way.
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
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/kv_fp8.cuh"

namespace lfm2::cuda {
namespace {

using namespace mma;

constexpr int kBQ = 64, kBKV = 64, kWarps = 4, kThreads = kWarps * 32;  // kBQ: the fp32 kernel's rows

// The tensor-core kernel's block: 4 warps of MT m16 row tiles each (kBQ rows = 64 * MT). With MT = 2
// each K / V fragment a warp loads from shared memory serves two mma row tiles (FlashAttention-2's
// 128-row blocks for head_dim <= 64): half the shared-memory reads per product, and each K / V tile
// copied in serves twice the rows.
// kF8: the double buffer holds e4m3 tiles (kBKV rows of HD bytes) and scales, widened into one T tile.
template <int HD, int MT, bool kF8 = false>
struct PrefillSmem {
  static constexpr int kRows = kWarps * 16 * MT;
  static constexpr int LD = HD + 8;  // padded rows: ldmatrix's 8 row addresses hit 8 distinct bank groups
  static constexpr int kQ = kRows * LD, kKV = kBKV * LD;
  static constexpr int kTStages = kF8 ? 1 : 2;  // T tiles of K (and of V)
  static constexpr int kF8Tile = kBKV * HD;     // bytes of an e4m3 stage
  static constexpr size_t kBytes = size_t(kQ + 2 * kTStages * kKV) * 2 +  // Q, K[], V[]
                                   (kF8 ? size_t(4) * (kF8Tile + kBKV * 4) : 0);  // e4m3 K[2], V[2], scales
};

// KV: T, or uint8_t for an fp8 cache (k_scale, v_scale its scale pools; null otherwise).
template <typename T, int HD, int MT, typename KV = T>
__global__ void __launch_bounds__(kThreads)
    prefill_tc_kernel(T* out, const T* q, const KV* k_pool, const KV* v_pool, const float* k_scale,
                      const float* v_scale, const PagedSeq* seqs, int n_seqs, const int32_t* block_table,
                      int max_pages, int shift, int n_heads, int n_kv, int group, int n_qtiles, int64_t q_stride,
                      float scale_log2) {
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  using S = PrefillSmem<HD, MT, kF8>;
  constexpr int LD = S::LD, NT = kBKV / 8, DT = HD / 8, KC = HD / 16, kChunks = HD / 8, kRows = S::kRows;
  constexpr int WR = 16 * MT;   // rows of a warp
  constexpr int kC8 = HD / 16;  // 16-byte chunks of an e4m3 row
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + S::kQ;                   // [kTStages][kBKV][LD]
  T* sv = sk + S::kTStages * S::kKV;    // [kTStages][kBKV][LD]
  uint8_t* k8 = reinterpret_cast<uint8_t*>(sv + S::kTStages * S::kKV);  // fp8: [2][kBKV][HD] e4m3
  uint8_t* v8 = k8 + 2 * S::kF8Tile;
  float* ks8 = reinterpret_cast<float*>(v8 + 2 * S::kF8Tile);  // fp8: [2][kBKV] scales
  float* vs8 = ks8 + 2 * kBKV;

  // blocks numbered (reversed query tile, sequence, KV head): the later, heavier tiles first
  const int per_tile = n_seqs * n_kv;
  const int qt = n_qtiles - 1 - int(blockIdx.x) / per_tile;
  const int si = (int(blockIdx.x) % per_tile) / n_kv, kvh = int(blockIdx.x) % n_kv;
  const PagedSeq seq = seqs[si];
  const int qpb = kRows / group, i0 = qt * qpb;  // queries per block, the block's first
  if (i0 >= seq.n_rows) return;
  const int nq = min(qpb, seq.n_rows - i0), n_valid = nq * group;
  const int pos0 = seq.first_pos + i0, k_end = pos0 + nq;  // its first query's position; keys 0 .. k_end - 1
  const PagedRows rows{block_table + int64_t(seq.table_row) * max_pages, shift, n_kv * HD};
  const int64_t head_off = int64_t(kvh) * HD;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  auto load_kv = [&](int stage, int k0) {
    if constexpr (kF8) {
      uint8_t* dk = k8 + stage * S::kF8Tile;
      uint8_t* dv = v8 + stage * S::kF8Tile;
      for (int c = tid; c < kBKV * kC8; c += kThreads) {
        const int r = c / kC8, col = (c % kC8) * 16, p = k0 + r;
        const bool ok = p < k_end;
        const int64_t off = ok ? rows.offset(p) + head_off + col : 0;
        cp_async16(dk + r * HD + col, k_pool + off, ok);
        cp_async16(dv + r * HD + col, v_pool + off, ok);
      }
      for (int r = tid; r < kBKV; r += kThreads) {
        const int p = k0 + r;
        const bool ok = p < k_end;
        const int64_t off = ok ? rows.offset(p) / HD + kvh : 0;  // (pool row, kv head)
        kv8::cp_async4(ks8 + stage * kBKV + r, k_scale + off, ok);
        kv8::cp_async4(vs8 + stage * kBKV + r, v_scale + off, ok);
      }
    } else {
      T* dk = sk + stage * S::kKV;
      T* dv = sv + stage * S::kKV;
      for (int c = tid; c < kBKV * kChunks; c += kThreads) {
        const int r = c / kChunks, col = (c % kChunks) * 8, p = k0 + r;
        const bool ok = p < k_end;
        const int64_t off = ok ? rows.offset(p) + head_off + col : 0;
        cp_async16(dk + r * LD + col, k_pool + off, ok);
        cp_async16(dv + r * LD + col, v_pool + off, ok);
      }
    }
  };
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < n_valid;
    const T* src = ok ? q + int64_t(seq.row + i0 + r / group) * q_stride + int64_t(kvh * group + r % group) * HD + col
                      : q;
    cp_async16(sq + r * LD + col, src, ok);
  }
  const int n_tiles = (k_end + kBKV - 1) / kBKV;
  load_kv(0, 0);
  cp_async_commit();

  // this lane's rows of row tile i: rr[i][0] = warp * WR + 16 i + g and rr[i][1] = that + 8; rows
  // past the block's queries see no key (qpos -1)
  int qpos[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * WR + 16 * i + 8 * h + g;
      qpos[i][h] = r < n_valid ? pos0 + r / group : -1;
    }
  const bool warp_active = warp * WR < n_valid;
  const int wq_first = pos0 + (warp * WR) / group;
  const int wq_last = pos0 + (min(warp * WR + WR - 1, n_valid - 1)) / group;

  uint32_t qf[MT][KC][4];
  float o[MT][DT][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < DT; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0.f;
  }

  for (int t = 0; t < n_tiles; ++t) {
    const int st = t & 1, k0 = t * kBKV;
    if (t + 1 < n_tiles) {
      load_kv(st ^ 1, k0 + kBKV);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
          ldmatrix_x4(qf[i][kc], sq + (warp * WR + 16 * i + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
    }
    if constexpr (kF8) {  // stage st widened into the T tile (free: the loop's last barrier)
      for (int c = tid; c < kBKV * kC8; c += kThreads) {
        const int r = c / kC8, ch = c % kC8;
        const uint4 bk = *reinterpret_cast<const uint4*>(k8 + st * S::kF8Tile + r * HD + ch * 16);
        const uint4 bv = *reinterpret_cast<const uint4*>(v8 + st * S::kF8Tile + r * HD + ch * 16);
        kv8::widen16<T>(sk + r * LD + ch * 16, sk + r * LD + ch * 16 + 8, bk, ks8[st * kBKV + r]);
        kv8::widen16<T>(sv + r * LD + ch * 16, sv + r * LD + ch * 16 + 8, bv, vs8[st * kBKV + r]);
      }
      __syncthreads();
    }
    // a warp whose queries all precede this tile (causal) or that has none has nothing to do
    if (warp_active && k0 <= wq_last) {
      const T* ks = sk + (kF8 ? 0 : st) * S::kKV;
      const T* vs = sv + (kF8 ? 0 : st) * S::kKV;
      float sc[MT][NT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) sc[i][j][0] = sc[i][j][1] = sc[i][j][2] = sc[i][j][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc)
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t b[4];
          const int mi = lane >> 3;
          ldmatrix_x4(b, ks + (j * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kc * 16 + (mi & 1) * 8);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma16816<T>(sc[i][j], qf[i][kc], b[0], b[1]);
            mma16816<T>(sc[i][j + 1], qf[i][kc], b[2], b[3]);
          }
        }
      // scale and causal mask (positions past the chunk lie after every query)
      const bool diag = k0 + kBKV - 1 > wq_first;
      float base[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = k0 + j * 8 + 2 * t4 + e;
            float a = sc[i][j][e] * scale_log2, b = sc[i][j][2 + e] * scale_log2;
            if (diag) {
              if (key > qpos[i][0]) a = -INFINITY;
              if (key > qpos[i][1]) b = -INFINITY;
            }
            sc[i][j][e] = a;
            sc[i][j][2 + e] = b;
            tmax0 = fmaxf(tmax0, a);
            tmax1 = fmaxf(tmax1, b);
          }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
          tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o2));
          tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o2));
        }
        // rows whose keys are all masked so far keep m = -inf; their alpha and p are then 0
        const float mn0 = fmaxf(m[i][0], tmax0), mn1 = fmaxf(m[i][1], tmax1);
        base[i][0] = mn0 == -INFINITY ? 0.f : mn0;
        base[i][1] = mn1 == -INFINITY ? 0.f : mn1;
        const float alpha0 = exp2f(m[i][0] - base[i][0]), alpha1 = exp2f(m[i][1] - base[i][1]);
        m[i][0] = mn0;
        m[i][1] = mn1;
        l[i][0] *= alpha0;
        l[i][1] *= alpha1;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          o[i][j][0] *= alpha0;
          o[i][j][1] *= alpha0;
          o[i][j][2] *= alpha1;
          o[i][j][3] *= alpha1;
        }
      }
#pragma unroll
      for (int kc = 0; kc < kBKV / 16; ++kc) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          float p[2][4];
#pragma unroll
          for (int hlf = 0; hlf < 2; ++hlf) {
            const int j = 2 * kc + hlf;
            p[hlf][0] = exp2f(sc[i][j][0] - base[i][0]);
            p[hlf][1] = exp2f(sc[i][j][1] - base[i][0]);
            p[hlf][2] = exp2f(sc[i][j][2] - base[i][1]);
            p[hlf][3] = exp2f(sc[i][j][3] - base[i][1]);
            l[i][0] += p[hlf][0] + p[hlf][1];
            l[i][1] += p[hlf][2] + p[hlf][3];
          }
          pa[i][0] = pack2<T>(p[0][0], p[0][1]);
          pa[i][1] = pack2<T>(p[0][2], p[0][3]);
          pa[i][2] = pack2<T>(p[1][0], p[1][1]);
          pa[i][3] = pack2<T>(p[1][2], p[1][3]);
        }
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
          uint32_t b[4];
          const int mi = lane >> 3;
          ldmatrix_x4_trans(b, vs + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * LD + d * 8 + (mi >> 1) * 8);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma16816<T>(o[i][d], pa[i], b[0], b[1]);
            mma16816<T>(o[i][d + 1], pa[i], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's load
  }
  if (!warp_active) return;
  const int64_t out_stride = int64_t(n_heads) * HD;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float li = l[i][h];
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) li += __shfl_xor_sync(0xffffffffu, li, o2);
      const int r = warp * WR + 16 * i + 8 * h + g;
      if (r >= n_valid) continue;
      const float inv = 1.f / li;
      T* ob = out + int64_t(seq.row + i0 + r / group) * out_stride + int64_t(kvh * group + r % group) * HD;
#pragma unroll
      for (int j = 0; j < DT; ++j)
        *reinterpret_cast<uint32_t*>(ob + j * 8 + 2 * t4) = pack2<T>(o[i][j][2 * h] * inv, o[i][j][2 * h + 1] * inv);
    }
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
    float sc[kKeys];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(&ks[j][d]);
        acc += qr[d] * kk.x + qr[d + 1] * kk.y + qr[d + 2] * kk.z + qr[d + 3] * kk.w;
      }
      sc[j] = (k0 + j <= qpos) ? acc : -INFINITY;
      tmax = fmaxf(tmax, sc[j]);
    }
    const float m_new = fmaxf(m, tmax);
    if (m_new == -INFINITY) continue;  // nothing visible yet (only rows past the chunk)
    const float alpha = exp2f(m - m_new);
    l *= alpha;
#pragma unroll
    for (int d = 0; d < HD; ++d) o[d] *= alpha;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const float p = exp2f(sc[j] - m_new);
      l += p;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 vv = *reinterpret_cast<const float4*>(&vs[j][d]);
        o[d] += p * vv.x;
        o[d + 1] += p * vv.y;
        o[d + 2] += p * vv.z;
        o[d + 3] += p * vv.w;
      }
    }
    m = m_new;
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
