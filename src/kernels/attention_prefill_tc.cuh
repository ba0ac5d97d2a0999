// The tensor-core kernel of chunked prefill (attention_paged_prefill.cu, whose header says what it
// computes and why) as a PrefillBlock: its shared memory (PrefillSmem), the K/V tile copies through
// the block table, the Q rows, and a warp's tile (scores, causal mask and online softmax, P V),
// then the normalised rows out. Included by that .cu only.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_mma.cuh"
#include "kernels/kv_fp8.cuh"
#include "kernels/paged_kv.h"

namespace lfm2::cuda::prefill {

using namespace mma;

constexpr int kBKV = 64, kWarps = 4, kThreads = kWarps * 32;  // key positions a tile; a block's warps

// The tensor-core kernel's block: 4 warps of MT m16 row tiles each (kRows = 64 * MT). With MT = 2
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

// The block's queries: nq consecutive queries of one sequence from its chunk's row i0, x the group's
// query heads of KV head kvh (mma row r: query r / group, head r % group).
struct PrefillRows {
  PagedSeq seq;
  int kvh, group, i0, nq;
};

// KV: T, or uint8_t for an fp8 cache (k_scale, v_scale its scale pools; null otherwise).
template <typename T, int HD, int MT, typename KV>
struct PrefillBlock {
  static constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  using S = PrefillSmem<HD, MT, kF8>;
  static constexpr int LD = S::LD, NT = kBKV / 8, DT = HD / 8, KC = HD / 16, kChunks = HD / 8, kRows = S::kRows;
  static constexpr int WR = 16 * MT;   // rows of a warp
  static constexpr int kC8 = HD / 16;  // 16-byte chunks of an e4m3 row

  T *sq, *sk, *sv;   // [kRows][LD], [kTStages][kBKV][LD] twice
  uint8_t *k8, *v8;  // fp8: [2][kBKV][HD] e4m3
  float *ks8, *vs8;  // fp8: [2][kBKV] scales
  PrefillRows b;
  PagedRows rows;
  const KV *k_pool, *v_pool;
  const float *k_scale, *v_scale;
  int n_kv;  // KV heads of the pools
  int n_valid, pos0, k_end;  // mma rows with a query; the first query's position; keys 0 .. k_end - 1
  int64_t head_off;
  int tid, warp, lane, g, t4;
  // this lane's rows of row tile i: warp * WR + 16 i + g and that + 8; rows past the block's queries
  // see no key (qpos -1)
  int qpos[MT][2];
  bool warp_active;
  int wq_first, wq_last;  // the positions of the warp's first and last queries
  // the warp's state: Q's A fragments, O (unnormalised), each row's max and sum
  uint32_t qf[MT][KC][4];
  float o[MT][DT][4];
  float m[MT][2], l[MT][2];

  __device__ __forceinline__ PrefillBlock(unsigned char* smem, const PrefillRows& br, const PagedRows& r,
                                          const KV* kp, const KV* vp, const float* ksc, const float* vsc, int nkv)
      : b(br), rows(r), k_pool(kp), v_pool(vp), k_scale(ksc), v_scale(vsc), n_kv(nkv) {
    sq = reinterpret_cast<T*>(smem);
    sk = sq + S::kQ;
    sv = sk + S::kTStages * S::kKV;
    k8 = reinterpret_cast<uint8_t*>(sv + S::kTStages * S::kKV);
    v8 = k8 + 2 * S::kF8Tile;
    ks8 = reinterpret_cast<float*>(v8 + 2 * S::kF8Tile);
    vs8 = ks8 + 2 * kBKV;
    n_valid = b.nq * b.group;
    pos0 = b.seq.first_pos + b.i0, k_end = pos0 + b.nq;
    head_off = int64_t(b.kvh) * HD;
    tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  }

  // The warp's rows and state (after the first copies are issued: the divisions behind them).
  __device__ __forceinline__ void start_rows() {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = warp * WR + 16 * i + 8 * h + g;
        qpos[i][h] = rr < n_valid ? pos0 + rr / b.group : -1;
      }
    warp_active = warp * WR < n_valid;
    wq_first = pos0 + (warp * WR) / b.group;
    wq_last = pos0 + (min(warp * WR + WR - 1, n_valid - 1)) / b.group;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
      for (int j = 0; j < DT; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
      m[i][0] = m[i][1] = -INFINITY;
      l[i][0] = l[i][1] = 0.f;
    }
  }

  // Keys k0 .. k0 + kBKV - 1 (and their scales) into stage `stage`; keys past k_end zero-filled.
  // A row is kRowChunks 16-byte copies of kChunkElems elements (bytes for e4m3), rows kDst apart.
  __device__ __forceinline__ void load_kv(int stage, int k0) const {
    constexpr int kRowChunks = kF8 ? kC8 : kChunks, kChunkElems = kF8 ? 16 : 8, kDst = kF8 ? HD : LD;
    KV* dk;
    KV* dv;
    if constexpr (kF8) {
      dk = k8 + stage * S::kF8Tile;
      dv = v8 + stage * S::kF8Tile;
    } else {
      dk = sk + stage * S::kKV;
      dv = sv + stage * S::kKV;
    }
    for (int c = tid; c < kBKV * kRowChunks; c += kThreads) {
      const int r = c / kRowChunks, col = (c % kRowChunks) * kChunkElems, p = k0 + r;
      const bool ok = p < k_end;
      const int64_t off = ok ? rows.offset(p) + head_off + col : 0;
      cp_async16(dk + r * kDst + col, k_pool + off, ok);
      cp_async16(dv + r * kDst + col, v_pool + off, ok);
    }
    if constexpr (kF8) {
      for (int r = tid; r < kBKV; r += kThreads) {
        const int p = k0 + r;
        const bool ok = p < k_end;
        const int64_t off = ok ? rows.offset(p) / HD + b.kvh : 0;  // (pool row, kv head)
        kv8::cp_async4(ks8 + stage * kBKV + r, k_scale + off, ok);
        kv8::cp_async4(vs8 + stage * kBKV + r, v_scale + off, ok);
      }
    }
  }

  // The block's query rows of q into sq; rows past its queries zero.
  __device__ __forceinline__ void load_q(const T* q, int64_t q_stride) const {
    for (int c = tid; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const bool ok = r < n_valid;
      const T* src =
          ok ? q + int64_t(b.seq.row + b.i0 + r / b.group) * q_stride + int64_t(b.kvh * b.group + r % b.group) * HD + col
             : q;
      cp_async16(sq + r * LD + col, src, ok);
    }
  }

  // fp8: stage st widened into the T tiles (free: the loop's last barrier)
  __device__ __forceinline__ void widen(int st) const {
    for (int c = tid; c < kBKV * kC8; c += kThreads) {
      const int r = c / kC8, ch = c % kC8;
      const uint4 bk = *reinterpret_cast<const uint4*>(k8 + st * S::kF8Tile + r * HD + ch * 16);
      const uint4 bv = *reinterpret_cast<const uint4*>(v8 + st * S::kF8Tile + r * HD + ch * 16);
      kv8::widen16<T>(sk + r * LD + ch * 16, sk + r * LD + ch * 16 + 8, bk, ks8[st * kBKV + r]);
      kv8::widen16<T>(sv + r * LD + ch * 16, sv + r * LD + ch * 16 + 8, bv, vs8[st * kBKV + r]);
    }
  }

  // S = Q K^T of the warp's rows against the tile in ks.
  __device__ __forceinline__ void score(const T* ks, float (&sc)[MT][NT][4]) const {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) sc[i][j][0] = sc[i][j][1] = sc[i][j][2] = sc[i][j][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t bf[4];
        const int mi = lane >> 3;
        ldmatrix_x4(bf, ks + (j * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kc * 16 + (mi & 1) * 8);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma16816<T>(sc[i][j], qf[i][kc], bf[0], bf[1]);
          mma16816<T>(sc[i][j + 1], qf[i][kc], bf[2], bf[3]);
        }
      }
  }

  // Scale and causal mask of the tile from key k0 (positions past the chunk lie after every query),
  // the rows' new max, O and the sums rescaled; base: the max each row's P is taken against.
  __device__ __forceinline__ void mask_rescale(int k0, float (&sc)[MT][NT][4], float (&base)[MT][2],
                                               float scale_log2) {
    const bool diag = k0 + kBKV - 1 > wq_first;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + j * 8 + 2 * t4 + e;
          float a = sc[i][j][e] * scale_log2, c = sc[i][j][2 + e] * scale_log2;
          if (diag) {
            if (key > qpos[i][0]) a = -INFINITY;
            if (key > qpos[i][1]) c = -INFINITY;
          }
          sc[i][j][e] = a;
          sc[i][j][2 + e] = c;
          tmax0 = fmaxf(tmax0, a);
          tmax1 = fmaxf(tmax1, c);
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
  }

  // P = 2^(s - base) into the sums and, rounded to T, O += P V over the tile in vs.
  __device__ __forceinline__ void pv(const T* vs, const float (&sc)[MT][NT][4], const float (&base)[MT][2]) {
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
        uint32_t bf[4];
        const int mi = lane >> 3;
        ldmatrix_x4_trans(bf, vs + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * LD + d * 8 + (mi >> 1) * 8);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma16816<T>(o[i][d], pa[i], bf[0], bf[1]);
          mma16816<T>(o[i][d + 1], pa[i], bf[2], bf[3]);
        }
      }
    }
  }

  // The tiles from key 0 through the double buffer, the next tile's copies in flight during each.
  __device__ __forceinline__ void run(float scale_log2) {
    const int n_tiles = (k_end + kBKV - 1) / kBKV;
    load_kv(0, 0);
    cp_async_commit();
    start_rows();
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
      if constexpr (kF8) {
        widen(st);
        __syncthreads();
      }
      // a warp whose queries all precede this tile (causal) or that has none has nothing to do
      if (warp_active && k0 <= wq_last) {
        float sc[MT][NT][4], base[MT][2];
        score(sk + (kF8 ? 0 : st) * S::kKV, sc);
        mask_rescale(k0, sc, base, scale_log2);
        pv(sv + (kF8 ? 0 : st) * S::kKV, sc, base);
      }
      __syncthreads();  // this stage is refilled by the next iteration's load
    }
  }

  // The warp's rows normalised into out (rows of n_heads heads).
  __device__ __forceinline__ void write_out(T* out, int n_heads) const {
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
        T* ob = out + int64_t(b.seq.row + b.i0 + r / b.group) * out_stride +
                int64_t(b.kvh * b.group + r % b.group) * HD;
#pragma unroll
        for (int j = 0; j < DT; ++j)
          *reinterpret_cast<uint32_t*>(ob + j * 8 + 2 * t4) = pack2<T>(o[i][j][2 * h] * inv, o[i][j][2 * h + 1] * inv);
      }
  }
};

}  // namespace lfm2::cuda::prefill
