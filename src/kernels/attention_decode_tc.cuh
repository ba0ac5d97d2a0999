// The tensor-core pass 1 of flash-decoding (attention_paged_decode.cu, whose header says what it
// computes, its variants and why): one block of kWarps warps per (sequence, split, KV head), as a
// DecodeBlock: its shared memory (DecodeSmem), the tile copies through the block table, a warp's
// rounds (scores, online softmax, P V) and the merge of the warps' states into the split's partial.
// Included by that .cu only.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_mma.cuh"
#include "kernels/kv_fp8.cuh"
#include "kernels/paged_kv.h"

namespace lfm2::cuda::decode {

using namespace mma;

constexpr int kTile = 64;  // positions a tile
constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kMaxGroup = 16;  // query heads per KV head: rows of one mma A operand

// What a pass-1 block works on.
struct Split {
  int seq, kvh, split;  // indices
  int row, start, end;  // q row; positions start .. end - 1
  bool active;
};

// kF8: the stages hold e4m3 tiles (kTile rows of HD bytes) and their scales; a T tile of V per tile
// of a round (each warp its own 16 rows; kV1: one, reused by the round's tiles in turn), none of K
// (widened into registers). Before the rounds (16 positions a warp, one V tile): 221-225 us at
// 32 x 10240 on an H100 (splits of 4 tiles), 5 blocks an SM (96 registers, 45 KB). Measured slower
// there: the block widening both into T
// tiles behind a second barrier 226 us; two T tiles pipelined 264; 5 or 6 stages (a 4-tile split in
// flight at once, 4 or 3 blocks an SM) 233 / 250; V widened in place over the warp's own e4m3 rows
// (no T tile, held to 96 registers: spills) 247 at 4 stages, 260 at 5.
template <int HD, bool kSwizzle, bool kF8 = false, int NT = 1, bool kV1 = false>
struct DecodeSmem {
  static constexpr int kStages = kSwizzle && HD < 128 ? 4 : 3;
  static_assert(kStages >= 2 * NT, "a round's tiles and the next round's in flight");
  static constexpr int kTK = kF8 ? 0 : kStages, kTV = kF8 ? (kV1 ? 1 : NT) : kStages;  // T tiles of K, of V
  static constexpr int LQ = HD + 8;                  // Q rows padded: ldmatrix's 8 rows hit 8 bank groups
  static constexpr int LKV = kSwizzle ? HD : HD + 8;  // K/V rows: swizzled, or padded as Q
  static constexpr int kQ = 16 * LQ, kKV = kTile * LKV;
  static constexpr int kF8Tile = kTile * HD;          // bytes of an e4m3 stage (K or V)
  static constexpr size_t kPipe =
      size_t(kQ + (kTK + kTV) * kKV) * 2 + (kF8 ? size_t(2 * kStages) * (kF8Tile + kTile * 4) : 0);
  static constexpr size_t kMerge = size_t(kWarps) * 16 * (HD + 2) * 4;  // per warp: o, max, sum of 16 rows
  static constexpr size_t kBytes = kPipe > kMerge ? kPipe : kMerge;

  // Element offset of 16-byte chunk c of K/V row r. Swizzled: the chunk's place among the 8 of its
  // 128-byte line XOR the row (head_dim >= 64) or the line (smaller heads, several rows a line), so
  // the 8 rows an ldmatrix reads at one chunk fall in 8 distinct bank groups.
  static __device__ __forceinline__ int kv(int r, int c) {
    if constexpr (!kSwizzle) {
      return r * LKV + c * 8;
    } else if constexpr (HD >= 64) {
      return r * HD + (((c & ~7) | ((c & 7) ^ (r & 7))) * 8);
    } else {
      const int u = r * (HD / 8) + c, line = u >> 3;
      return ((line << 3) | ((u & 7) ^ (line & 7))) * 8;
    }
  }
  // Byte offset of 16-byte unit c of e4m3 row r: the unit's place in its 128-byte line XOR the line,
  // so the 8 rows a warp's lanes g = 0..7 read at one unit fall in 8 distinct bank groups.
  static __device__ __forceinline__ int kv8(int r, int c) {
    const int u = r * (HD / 16) + c, line = u >> 3;
    return ((line << 3) | ((u & 7) ^ (line & 7))) * 16;
  }
};

// KV: T, or uint8_t for an fp8 cache (k_scale, v_scale its scale pools; null otherwise). The
// template's flags are the variant's (attention_paged_decode.cu, "Variants"): NT tiles a round,
// kHalf the half A operand, kV1 one V T tile (fp8), kPK K's head dims permuted.
template <typename T, int HD, bool kSwizzle, bool kL2Prefetch, typename KV, int NT, bool kHalf, bool kV1, bool kPK>
struct DecodeBlock {
  static constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  using S = DecodeSmem<HD, kSwizzle, kF8, NT, kV1>;
  static constexpr int LQ = S::LQ, KC = HD / 16, DT = HD / 8, kChunks = HD / 8, kStages = S::kStages;
  static constexpr int kC8 = HD / 16;  // 16-byte chunks of an e4m3 row
  // 16-byte chunks of a K / V row (HD * sizeof(KV) bytes); a thread's copies a tile are a trip count
  // known at compile time (the loop unrolled, no remainder loops): the fp8 kernel, bound by
  // instruction issue, 196 -> 188 us at 32 x 10,240 (H100)
  static constexpr int kRowChunks = HD * int(sizeof(KV)) / 16, kChunkElems = 16 / int(sizeof(KV));
  static constexpr int kCopies = (kTile * kRowChunks + kThreads - 1) / kThreads;
  static_assert(kThreads % kRowChunks == 0, "a thread's chunk the same in every copy");
  static_assert(kTile == 64, "a tile's pages: kTile >> shift for shift < 6");
  static_assert(kThreads >= kTile, "one thread a scale row");

  T *sk, *sv, *sq;       // [kTK][kTile rows], [kTV][kTile rows], [16][LQ]
  uint8_t *k8, *v8;      // fp8: [kStages][kTile][HD] e4m3
  float *ks8, *vs8;      // fp8: [kStages][kTile] scales
  Split sp;
  PagedRows rows;
  int tid, warp, lane, g, t4;
  const KV *k_src, *v_src;  // the pools from this thread's copy chunk of the KV head on
  const float *k_scale, *v_scale;
  int n_kv, tile_pages, slot_mask;
  float scale_log2;
  // the warp's state: Q's A fragments, O (16 rows, unnormalised), each row's max and sum
  uint32_t qf[KC][4];
  float o[DT][4];
  float m0, m1, l0, l1;

  __device__ __forceinline__ DecodeBlock(unsigned char* smem, const Split& s, const PagedRows& r, const KV* k_pool,
                                         const KV* v_pool, const float* ksc, const float* vsc, int nkv, float sl2)
      : sp(s), rows(r), k_scale(ksc), v_scale(vsc), n_kv(nkv), scale_log2(sl2) {
    sk = reinterpret_cast<T*>(smem);
    sv = sk + S::kTK * S::kKV;
    sq = sv + S::kTV * S::kKV;
    k8 = reinterpret_cast<uint8_t*>(sq + S::kQ);
    v8 = k8 + kStages * S::kF8Tile;
    ks8 = reinterpret_cast<float*>(v8 + kStages * S::kF8Tile);
    vs8 = ks8 + kStages * kTile;
    tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // A tile's copies: copy i of thread tid is chunk c % kRowChunks of row c / kRowChunks, c = tid
    // + i kThreads (a warp's copies whole rows, contiguous); the chunk is the same in every copy, so
    // a thread's sources are the pools from its chunk of the KV head on plus a row's offset (a
    // 32-bit pool row, one widening multiply). Against a 64-bit offset a copy: 11 % fewer
    // instructions in the fp8 kernel, 7 % (fp8 cache) and 5 % (bf16) faster on an H200
    // (docs/results.md, twentieth session).
    const int64_t head_off = int64_t(sp.kvh) * HD;
    const int copy_chunk = tid % kRowChunks;
    k_src = k_pool + head_off + copy_chunk * kChunkElems;
    v_src = v_pool + head_off + copy_chunk * kChunkElems;
    // A tile (kTile positions from a multiple of kTile) lies on kTile >> shift pages, or on one:
    // lane j of every warp loads the block-table entry of page j of it, a round before the tile's
    // copies, and a copy takes its row's entry by a shuffle (one load a tile instead of one a copy,
    // its latency hidden behind a round; H200: 1-1.5 % faster at 32 x 8,192 on either cache, 4.5 %
    // at 8 x 32,768 on the fp8 one, the long-scoreboard stalls 0.67 -> 0.28 cycles an instruction).
    tile_pages = rows.shift < 6 ? kTile >> rows.shift : 1, slot_mask = (1 << rows.shift) - 1;
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  }

  // kPK: mma k index (chunk kc, k in 0..15) <-> head dim, the same for Q and K, so that lane t4's B
  // fragments of every chunk are head dims t4 HD / 4 .. + HD / 4 - 1 of its row, read at once (one
  // 16-byte load an e4m3 row at head_dim 64) instead of a load a chunk
  static __device__ __forceinline__ int k_dim(int col) {
    const int kc = col / 16, k = col % 16;
    return (HD / 4) * ((k % 8) / 2) + 4 * kc + (k % 2) + 2 * (k / 8);
  }

  // The group's query rows (of qb, group of them) into sq; rows past the group zero.
  __device__ __forceinline__ void load_q(const T* qb, int group) {
    if constexpr (kPK) {  // Q's head dims permuted (k_dim), a pair of T a copy
      for (int c = tid; c < 8 * HD; c += kThreads) {
        const int r = c / (HD / 2), col = 2 * (c % (HD / 2));
        const uint32_t v = r < group ? *reinterpret_cast<const uint32_t*>(qb + int64_t(r) * HD + k_dim(col)) : 0u;
        *reinterpret_cast<uint32_t*>(sq + r * LQ + col) = v;
      }
    } else {
      for (int c = tid; c < 16 * kChunks; c += kThreads) {
        const int r = c / kChunks, col = (c % kChunks) * 8;
        cp_async16(sq + r * LQ + col, r < group ? qb + int64_t(r) * HD + col : qb, r < group);
      }
    }
  }

  // Lane j's block-table entry of tile t: page j of it (0 past the tile's pages or the length).
  __device__ __forceinline__ int32_t tile_entry(int t) const {
    int32_t e = 0;
    if (lane < tile_pages) {
      const int p = sp.start + t * kTile + (lane << rows.shift);
      if (p < sp.end) e = rows.table[p >> rows.shift];  // entries past the length are never read
    }
    return e;
  }
  // Row r's pool row in the tile whose entries the lanes hold (an entry not loaded is 0, page 0: a
  // valid address for a copy that reads nothing).
  __device__ __forceinline__ uint32_t pool_row(int32_t entry, int r, int p) const {
    const uint32_t page = uint32_t(__shfl_sync(0xffffffffu, entry, rows.shift < 6 ? r >> rows.shift : 0));
    return (page << rows.shift) | uint32_t(p & slot_mask);
  }

  // Tile t's K, V (and scales) into stage `stage`, through its lanes' block-table entries.
  __device__ __forceinline__ void load_tile(int stage, int t, int32_t entry) const {
    const int p0 = sp.start + t * kTile;
    KV* dk;
    KV* dv;
    if constexpr (kF8) {
      dk = k8 + stage * S::kF8Tile;
      dv = v8 + stage * S::kF8Tile;
    } else {
      dk = sk + stage * S::kKV;
      dv = sv + stage * S::kKV;
    }
    const int copy_chunk = tid % kRowChunks;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int c = tid + i * kThreads;
      if (kTile * kRowChunks % kThreads != 0 && c >= kTile * kRowChunks) break;
      const int r = c / kRowChunks, p = p0 + r;
      const bool ok = p < sp.end;
      const int64_t off = int64_t(uint64_t(pool_row(entry, r, p)) * uint32_t(rows.row_elems));
      int d;  // the chunk's place in the stage, in KV elements (bytes of e4m3)
      if constexpr (kF8)
        d = S::kv8(r, copy_chunk);
      else
        d = S::kv(r, copy_chunk);
      if constexpr (kL2Prefetch) {
        cp_async16_l2_256(dk + d, k_src + off, ok);
        cp_async16_l2_256(dv + d, v_src + off, ok);
      } else {
        cp_async16(dk + d, k_src + off, ok);
        cp_async16(dv + d, v_src + off, ok);
      }
    }
    if constexpr (kF8) {
      if (tid < kTile) {  // one scale of K and of V a row (warps 0, 1: a branch for the warp)
        const int r = tid, p = p0 + r;
        const bool ok = p < sp.end;
        const int64_t so = int64_t(uint64_t(pool_row(entry, r, p)) * uint32_t(n_kv)) + sp.kvh;  // (pool row, kv head)
        kv8::cp_async4(ks8 + stage * kTile + r, k_scale + so, ok);
        kv8::cp_async4(vs8 + stage * kTile + r, v_scale + so, ok);
      }
    }
  }

  // e4m3 row r's bytes t4 HD / 4 .. as HD / 16 words (word kc: head dims 4 kc .. 4 kc + 3 of the lane's)
  __device__ __forceinline__ void k_words8(uint32_t* w, const uint8_t* k8t, int r) const {
    if constexpr (HD >= 64) {
#pragma unroll
      for (int u = 0; u < HD / 64; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(k8t + S::kv8(r, t4 * (HD / 64) + u));
        w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
      }
    } else if constexpr (HD == 32) {
      const uint2 v = *reinterpret_cast<const uint2*>(k8t + S::kv8(r, t4 >> 1) + (t4 & 1) * 8);
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(k8t + S::kv8(r, 0) + t4 * 4);
    }
  }
  // T row r's elements t4 HD / 4 .. as HD / 8 words (words 2 kc, 2 kc + 1: the pairs of chunk kc)
  __device__ __forceinline__ void k_words(uint32_t* w, const T* kt, int r) const {
    if constexpr (HD >= 32) {
#pragma unroll
      for (int u = 0; u < HD / 32; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(kt + S::kv(r, t4 * (HD / 32) + u));
        w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
      }
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(kt + S::kv(r, t4 >> 1) + (t4 & 1) * 4);
      w[0] = v.x, w[1] = v.y;
    }
  }

  // fp8: V rows 16 warp .. + 15 of tile t + i -> T tile dst (the warp's own rows)
  __device__ __forceinline__ void widen_v(int t, int i, T* dst) const {
    const int st = (t + i) % kStages;
    const uint8_t* v8t = v8 + st * S::kF8Tile;
    for (int c = lane; c < 16 * kC8; c += 32) {
      const int r = 16 * warp + c / kC8, ch = c % kC8;
      const uint4 bv = *reinterpret_cast<const uint4*>(v8t + S::kv8(r, ch));
      kv8::widen16<T>(dst + S::kv(r, 2 * ch), dst + S::kv(r, 2 * ch + 1), bv, vs8[st * kTile + r]);
    }
  }

  // S = Q K^T of the warp's 16 positions of tile t + i, for each i of the round.
  __device__ __forceinline__ void score(int t, float (&sc)[NT][2][4]) const {
    const int mi = lane >> 3;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int st = (t + i) % kStages;
#pragma unroll
      for (int j = 0; j < 2; ++j) sc[i][j][0] = sc[i][j][1] = sc[i][j][2] = sc[i][j][3] = 0.f;
      if constexpr (kPK) {  // the lane's HD / 4 head dims of rows g, 8 + g: words kc of k_dim's order
        uint32_t w[2][kF8 ? KC : 2 * KC];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = 16 * warp + 8 * j + g;
          if constexpr (kF8)
            k_words8(w[j], k8 + st * S::kF8Tile, r);
          else
            k_words(w[j], sk + st * S::kKV, r);
        }
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          uint32_t b[4];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            if constexpr (kF8) {
              const float s = ks8[st * kTile + 16 * warp + 8 * j + g];
              b[2 * j] = kv8::widen2<T>(w[j][kc], s);
              b[2 * j + 1] = kv8::widen2<T>(w[j][kc] >> 16, s);
            } else {
              b[2 * j] = w[j][2 * kc];
              b[2 * j + 1] = w[j][2 * kc + 1];
            }
          }
          mma16816<T>(sc[i][0], qf[kc], b[0], b[1]);
          mma16816<T>(sc[i][1], qf[kc], b[2], b[3]);
        }
      } else {
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          uint32_t b[4];
          if constexpr (kF8) {  // b as ldmatrix_x4 below gives it: rows g, 8 + g; pairs t4, 4 + t4 of unit kc
            const uint8_t* k8t = k8 + st * S::kF8Tile;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int r = 16 * warp + 8 * j + g;
              const uint4 u = *reinterpret_cast<const uint4*>(k8t + S::kv8(r, kc));
              const float s = ks8[st * kTile + r];
              const int sh = 16 * (t4 & 1);
              b[2 * j] = kv8::widen2<T>((t4 & 2 ? u.y : u.x) >> sh, s);
              b[2 * j + 1] = kv8::widen2<T>((t4 & 2 ? u.w : u.z) >> sh, s);
            }
          } else {
            ldmatrix_x4(b, sk + st * S::kKV + S::kv(16 * warp + (mi >> 1) * 8 + (lane & 7), kc * 2 + (mi & 1)));
          }
          mma16816<T>(sc[i][0], qf[kc], b[0], b[1]);
          mma16816<T>(sc[i][1], qf[kc], b[2], b[3]);
        }
      }
    }
  }

  // The online softmax over the round's scores (kw: the warp's first position of the round): the
  // new max, O and the sums rescaled, P = 2^(s - max) into pa (T pairs, the P V A operand).
  __device__ __forceinline__ void softmax(int kw, float (&sc)[NT][2][4], uint32_t (&pa)[NT][4]) {
    float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = kw + i * kTile + j * 8 + 2 * t4 + e < sp.end;
          sc[i][j][e] = ok ? sc[i][j][e] * scale_log2 : -INFINITY;
          tmax0 = fmaxf(tmax0, sc[i][j][e]);
          if constexpr (!kHalf) {
            sc[i][j][2 + e] = ok ? sc[i][j][2 + e] * scale_log2 : -INFINITY;
            tmax1 = fmaxf(tmax1, sc[i][j][2 + e]);
          }
        }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o2));
      if constexpr (!kHalf) tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o2));
    }
    // position kw is valid, so every row's new max is finite
    const float mn0 = fmaxf(m0, tmax0), alpha0 = exp2f(m0 - mn0);
    m0 = mn0;
    l0 *= alpha0;
    float mn1 = 0.f, alpha1 = 0.f;
    if constexpr (!kHalf) {
      mn1 = fmaxf(m1, tmax1), alpha1 = exp2f(m1 - mn1);
      m1 = mn1;
      l1 *= alpha1;
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][0] *= alpha0;
      o[j][1] *= alpha0;
      if constexpr (!kHalf) {
        o[j][2] *= alpha1;
        o[j][3] *= alpha1;
      }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float p[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        p[j][0] = exp2f(sc[i][j][0] - mn0);
        p[j][1] = exp2f(sc[i][j][1] - mn0);
        l0 += p[j][0] + p[j][1];
        if constexpr (!kHalf) {
          p[j][2] = exp2f(sc[i][j][2] - mn1);
          p[j][3] = exp2f(sc[i][j][3] - mn1);
          l1 += p[j][2] + p[j][3];
        }
      }
      pa[i][0] = pack2<T>(p[0][0], p[0][1]);
      pa[i][2] = pack2<T>(p[1][0], p[1][1]);
      pa[i][1] = kHalf ? 0u : pack2<T>(p[0][2], p[0][3]);
      pa[i][3] = kHalf ? 0u : pack2<T>(p[1][2], p[1][3]);
    }
  }

  // O += P V over the round's tiles (fp8, kV1: tile t + i's V widened into the one T tile in turn).
  __device__ __forceinline__ void pv(int t, const uint32_t (&pa)[NT][4]) {
    const int mi = lane >> 3;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      if constexpr (kF8) {
        if (kV1 && i > 0) {  // tile t + i - 1's ldmatrix done: its rows rewritten with tile t + i's
          __syncwarp();
          widen_v(t, i, sv);
        }
        __syncwarp();  // the warp's V rows written
      }
      const T* vs = sv + (kF8 ? (kV1 ? 0 : i) : (t + i) % kStages) * S::kKV;
#pragma unroll
      for (int d = 0; d < DT; d += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + S::kv(16 * warp + (mi & 1) * 8 + (lane & 7), d + (mi >> 1)));
        mma16816<T>(o[d], pa[i], b[0], b[1]);
        mma16816<T>(o[d + 1], pa[i], b[2], b[3]);
      }
    }
  }

  // Round t / NT: tiles t .. t + NT - 1, this warp's 16 positions of each (16 NT positions) scored
  // as one: one max, rescale and exp round, then P V. kHalf (group <= 8): A rows 8..15 hold no query
  // head, so their max, exp, sum and rescale are skipped and their P is 0 (the live rows' bits are
  // the same either way).
  __device__ __forceinline__ void attend(int t) {
    const int kw = sp.start + t * kTile + 16 * warp;  // this warp's first position of the round
    if (kw >= sp.end) return;
    if constexpr (kF8) {  // the warp's ldmatrix of the last round is done; kV1: tile t's V only, t + 1's after its P V
      __syncwarp();
#pragma unroll
      for (int i = 0; i < S::kTV; ++i) widen_v(t, i, sv + i * S::kKV);
    }
    float sc[NT][2][4];
    score(t, sc);
    uint32_t pa[NT][4];
    softmax(kw, sc, pa);
    pv(t, pa);
  }

  // The split's tiles in rounds of NT, kStages - NT tiles in flight ahead of the round.
  __device__ __forceinline__ void run() {
    const int n_tiles = (sp.end - sp.start + kTile - 1) / kTile;
    const int n_round_tiles = (n_tiles + NT - 1) / NT * NT;  // a round's tiles past the split's end zero-filled
#pragma unroll
    for (int s = 0; s < kStages - NT; ++s) {
      if (s < n_round_tiles) load_tile(s, s, tile_entry(s));
      cp_async_commit();  // empty groups keep the count uniform
    }
    int32_t entries[NT];  // the entries of the tiles the next round copies
#pragma unroll
    for (int i = 0; i < NT; ++i) entries[i] = tile_entry(kStages - NT + i);
    // rounds of NT tiles; the stages of round r - 1's tiles are refilled in round r
    for (int t = 0; t < n_round_tiles; t += NT) {
      cp_async_wait<kStages - 2 * NT>();  // tiles t .. t + NT - 1 (and the Q rows) landed
      __syncthreads();                    // ... for every thread; the last round's stages are free
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const int tl = t + kStages - NT + i;
        if (tl < n_round_tiles) load_tile(tl % kStages, tl, entries[i]);
        cp_async_commit();
      }
#pragma unroll
      for (int i = 0; i < NT; ++i) entries[i] = tile_entry(t + kStages + i);  // the next round's tiles
      if (t == 0) {
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[kc], sq + (lane & 15) * LQ + kc * 16 + (lane >> 4) * 8);
      }
      attend(t);
    }
    cp_async_wait<0>();
  }

  // The 4 warps' states merged in warp order (through smem, the stages no longer read) and the
  // split's (O unnormalised, max, sum) of each of the group's rows written to the workspace.
  __device__ __forceinline__ void write_partial(unsigned char* smem, float* part_o, float2* part_ml, int n_heads,
                                                int group, int ms) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    __syncthreads();  // the stages are no longer read: the merge reuses them
    float* mo = reinterpret_cast<float*>(smem);  // [kWarps][16][HD]
    float* mm = mo + kWarps * 16 * HD;           // [kWarps][16] max
    float* ml = mm + kWarps * 16;                // [kWarps][16] sum
    const int r0 = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int col = j * 8 + 2 * t4;
      mo[r0 * HD + col] = o[j][0];
      mo[r0 * HD + col + 1] = o[j][1];
      mo[(r0 + 8) * HD + col] = o[j][2];
      mo[(r0 + 8) * HD + col + 1] = o[j][3];
    }
    if (t4 == 0) {
      mm[r0] = m0, ml[r0] = l0;
      mm[r0 + 8] = m1, ml[r0 + 8] = l1;
    }
    __syncthreads();
    // warps in order; a warp that saw no position has max -inf, weight 0 and o = l = 0
    for (int i = tid; i < group * HD; i += kThreads) {
      const int r = i / HD, d = i - r * HD;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mm[w * 16 + r]);
      float O = 0.f, L = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(mm[w * 16 + r] - M);
        O += mo[(w * 16 + r) * HD + d] * wt;
        L += ml[w * 16 + r] * wt;
      }
      const int64_t idx = (int64_t(sp.seq) * n_heads + sp.kvh * group + r) * ms + sp.split;
      part_o[idx * HD + d] = O;
      if (d == 0) part_ml[idx] = make_float2(M, L);
    }
  }
};

}  // namespace lfm2::cuda::decode
