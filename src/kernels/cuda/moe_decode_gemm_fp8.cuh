// The decode products on FP8 weights (docs/fp8.md): a persistent pipelined grouped GEMM that
// streams each touched expert's e4m3 weights once (half the bytes of bf16) and widens them in
// registers, straight into the mma.sync A fragments.
//
// Work, units, passes, the producer/consumer walk and PDL are moe_decode_gemm.cuh's; what differs:
// - A stage is 128 k: the e4m3 tile (kRows rows of 128 bytes: 16 KB for 128 rows, what a 64-k bf16
//   stage holds) and the token tile (kTB rows of 128 16-bit k). One 128-k stage is one 128 x 128
//   scale block's k range, so a block128 scale is constant over a warp's stage.
// - Warps: warp w = (rg = w % kRG, kh = w / kRG) multiplies weight rows [32 rg, +32) (two m16 tiles;
//   gate/up: the gate and up rows of the same 16 j) by every live token n8 tile, over its k slice
//   [kh kSlice, +kSlice) of each stage (split-K inside the block: each weight is widened once). At
//   the end of a (unit, pass) warps kh > 0 leave their sums in shared memory and warps kh = 0 add
//   them in kh order, scale (channel) and store. KH = 2 (128-row units) for the MoE; KH = 8 (32-row
//   units, 4x as many) for the small dense projections.
// - Widening: lane (g, q) reads its rows' kSlice / 4 contiguous bytes; word s (4 e4m3) is mma step
//   s: the low pair its k columns {2q, 2q + 1}, the high pair {2q + 8, 2q + 9}. The token fragments
//   are read with the same k permutation (8 bytes of the token row per step), so every step
//   multiplies matching k. e4m3 -> fp16 is exact (hardware cvt); bf16 from that fp16 by bit
//   placement (x 2^-112, always a bf16 normal) and one exact multiply by 2^112.
// - Scales: channel: the row's scale multiplies the fp32 sum at the store. block128: each warp's
//   stage slice is an mma chain from zero, added into the accumulator times the block's scale.
//
// Exactness: an output element (feature, token) is, per warp slice kh, a fixed sequence over the
// stages in ascending k of mma steps from that feature's weight row and that token's row alone,
// then the kh sums added in kh order; the split (KH) depends on the shape only, never on the rows.
// A row's bits therefore depend on its own input and experts only.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_fp8.h>

#include "kernels/cuda/moe_decode_gemm.cuh"

namespace lfm2::cuda::moe_gemm_fp8 {

constexpr int kMaxExperts = 256;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBK = 128;            // k per stage
constexpr int kSmemMax = 232448;    // an H100 block's shared memory (227 KB)
constexpr int kSmemHalf = 115712;   // each of two blocks on an SM (228 KB, less 1 KB the driver keeps a block)

// KH warps along k (2 or 8), XR token slots per pass (8, 16, 32 or 64: the token tile's rows); F8:
// the tokens in e4m3 (FP8 x FP8 products), then the token tile is XR rows of 128 bytes and, for
// block scales, the XR tokens' scales of the stage's k block. BPS: blocks an SM (1, or 2 with half the
// shared memory each).
template <int KH, int XR, bool F8 = false, int BPS = 1>
struct Shape {
  static constexpr int kRG = kWarps / KH;     // row groups of 32 rows
  static constexpr int kRows = 32 * kRG;      // weight rows per unit
  static constexpr int kSlice = kBK / KH;     // k of a warp in a stage
  static constexpr int kLaneB = kSlice / 4;   // e4m3 bytes of a lane's row per stage
  static constexpr int kSteps = kSlice / 16;  // mma k steps of a warp per stage
  static constexpr int kNT = XR / 8;          // token n8 tiles
  static constexpr int kTileW = kRows * kBK;  // e4m3 tile
  static constexpr int kTileX = F8 ? XR * kBK + XR * 4 : XR * kBK * 2;  // token tile (256-byte rows; F8: 128)
  static constexpr int kStage = kTileW + kTileX;
  static constexpr int kRed = (KH - 1) * kRG * 32 * (8 * kNT) * 4;  // the sums of warps kh > 0
  static constexpr bool kAlias = kRed <= kStage;  // the sums go into the stage just consumed
  // + offsets, touched, count, the unit ring
  static constexpr int kFixed = (kAlias ? 0 : kRed) + (2 * kMaxExperts + 4 + 32) * 4;
  // as many stages as fit (the weight bytes in flight set the bandwidth), at most 16
  static constexpr int kSmemBlock = BPS == 1 ? kSmemMax : kSmemHalf;
  static constexpr int kStages = (kSmemBlock - kFixed) / kStage < 16 ? (kSmemBlock - kFixed) / kStage : 16;
  static constexpr int kSmem = kStages * kStage + kFixed;
};

enum OutMode { kOutT = 0, kOutF32 = 1, kOutAddF32 = 2 };
// The widening of the e4m3 weights (widen_bits, widen_cvt; none: timing only).
enum Widen { kWidenNone = 0, kWidenBits = 1, kWidenCvt = 2 };

struct Args {
  const uint8_t* w;          // (E, rows, K) e4m3: gate/up w13 (rows 2 R: w1 rows then w3 rows), down w2 / dense (R)
  const float* s;            // scales: channel (E, rows); block128 (E, row blocks, k blocks), see row_block
  const void* x;             // gate/up: in (n_tokens, K); down: act or the dense rows (P, K), T
  const int32_t* offsets;    // (E + 1); null in dense mode
  const int32_t* src_token;  // (P), gate/up only (not F8: there x holds the permuted rows)
  void* out;                 // gate/up: act (P, R) T (F8: fp32); down: (P, R) by out_mode
  int64_t K, R;
  int n_experts;
  int dense_rows;            // > 0: dense mode, P = dense_rows rows of x, one expert
  int block_scales;          // 1: 128 x 128 blocks; 0: one scale per row
  int out_mode;              // down only: OutMode
  int l2_hints;
  int widen = kWidenBits;    // Widen; kWidenNone: the e4m3 bits as they are (timing only: wrong results)
  int variant = 0;           // bench only: 1 = token tiles one at a time in stage_mma, 16 = see late_launch (the same bits)
  const float* xs = nullptr;  // F8: x's e4m3 scales, channel (P), block128 (P, ceil(K / 128))
  // units taken from a counter (zero at the launch) instead of a fixed share per block; null: fixed
  int* ctr = nullptr;
};

// The scale row of weight row `row` of an expert whose matrix is [first r1 rows; the rest].
__device__ __forceinline__ int64_t row_block(int64_t row, int64_t r1, bool blocks) {
  if (!blocks) return row;
  return row < r1 ? row / 128 : (r1 + 127) / 128 + (row - r1) / 128;
}

// Shared-memory offsets. Weight tile: 128-byte rows, chunk c of row r at c ^ wsw(r) (rows g and
// g + 1 in opposite halves for the 16-byte reads of KH = 2; the 8 rows of a 4-byte read of KH = 8
// in 8 different chunks). Token tile: 256-byte rows, the swizzle by KH's read pattern.
__device__ __forceinline__ uint32_t woff(int r, int c) {
  return uint32_t(r * kBK + ((c ^ (((r & 1) << 2) | ((r >> 1) & 3))) << 4));
}
template <int KH>
__device__ __forceinline__ uint32_t xoff(int n, int c) {
  return uint32_t(n * 2 * kBK + ((c ^ (KH == 2 ? (n & 1) : 2 * (n & 3))) << 4));
}

// Bytes 2 kHi and 2 kHi + 1 of v (element 0 low) to T x 2, exactly, on the integer and FMA pipes:
// each byte into the top of its 16-bit half (one byte_perm), its 7 exponent-significand bits moved
// under T's sign so that the half reads as the value x 2^-8 (fp16) or x 2^-120 (bf16) (e4m3
// subnormals land on T subnormals), then one multiply by 2^8 / 2^120.
template <typename T, int kHi>
__device__ __forceinline__ uint32_t widen_bits(uint32_t v) {
  const uint32_t t = __byte_perm(v, 0u, kHi ? 0x3424u : 0x1404u);  // b1 << 24 | b0 << 8
  if constexpr (std::is_same_v<T, __half>) {
    const uint32_t h = ((t >> 1) & 0x3f803f80u) | (t & 0x80008000u);
    const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h), __half2(__ushort_as_half(0x5c00), __ushort_as_half(0x5c00)));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const uint32_t b = ((t >> 4) & 0x07f007f0u) | (t & 0x80008000u);
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b),
                                     __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80)));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// The same by the hardware conversion (e4m3x2 -> f16x2, exact), then for bf16 from that fp16 by bit
// placement (the value x 2^-112, a bf16 normal) and one multiply by 2^112. (Kept for the bench: the
// conversion instruction issues at a quarter of the integer rate.)
template <typename T, int kHi>
__device__ __forceinline__ uint32_t widen_cvt(uint32_t v) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((v >> (16 * kHi)) & 0xffffu), __NV_E4M3);
  const uint32_t h = uint32_t(hr.x) | (uint32_t(hr.y) << 16);
  if constexpr (std::is_same_v<T, __half>) {
    return h;
  } else {
    const uint32_t b = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b),
                                     __halves2bfloat162(__ushort_as_bfloat16(0x7780), __ushort_as_bfloat16(0x7780)));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// moe_gemm::unit_of with passes of XR token slots.
template <int XR>
__device__ __forceinline__ moe_gemm::Unit unit_of(int64_t u, int64_t tiles, const int* s_touched, const int* s_off) {
  moe_gemm::Unit un = moe_gemm::unit_of(u, tiles, s_touched, s_off);
  un.passes = (un.n_e + XR - 1) / XR;
  return un;
}

// The units from a counter: moe_gemm::UnitRing (moe_decode_gemm.cuh).
using moe_gemm::UnitRing;

// d = A B (C = 0) and d += A B, m16n8k16, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_first(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  d[0] = d[1] = d[2] = d[3] = 0.f;
  gemv::mma16816<T>(d, a[0], a[1], a[2], a[3], b0, b1);
}

// d (+)= A B, m16n8k32, e4m3 x e4m3, fp32 accumulation (sm_89+). A: a0 / a2 row g, k 4q.. / 16 + 4q..,
// a1 / a3 row g + 8; B: b0 / b1 column g, k 4q.. / 16 + 4q.. (4 bytes each, the lowest k lowest).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 4 bytes global -> shared (zeros when !live; src must still be a valid address).
__device__ __forceinline__ void cp4(uint32_t dst, const void* src, bool live) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 4 : 0) : "memory");
}

// The weight half of both feeders: the thread's weight rows of a unit (t / 8 + 32 i; null past the
// end) and their 16-byte pieces of a stage.
template <bool kGateUp, class Sh>
struct WeightFeed {
  const uint8_t* w[Sh::kRG];
  uint64_t pol_w;

  __device__ __forceinline__ void set_unit(const Args& a, const moe_gemm::Unit& un) {
    const int64_t rows = (kGateUp ? 2 : 1) * a.R;
    const uint8_t* we = a.w + int64_t(un.e) * rows * a.K;
#pragma unroll
    for (int i = 0; i < Sh::kRG; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      int64_t f, row;
      if constexpr (kGateUp) {
        f = un.tile * 64 + 16 * (r >> 5) + (r & 15);
        row = ((r >> 4) & 1) * a.R + f;
      } else {
        f = un.tile * Sh::kRows + r;
        row = f;
      }
      w[i] = f < a.R ? we + row * a.K : nullptr;
    }
  }
  __device__ __forceinline__ void load_w(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 16 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < Sh::kRG; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && w[i] != nullptr;
      moe_gemm::cp16<true>(stage + woff(r, c), live ? static_cast<const void*>(w[i] + k) : a.w, live, pol_w);
    }
  }
};

// The producer side of one thread for F8 (gate/up and down alike: x holds the permuted rows in e4m3):
// thread t copies chunk t % 8 of weight rows t / 8 + 32 i and of token rows t / 8 + 32 i, and with
// block scales thread t < XR token t's scale of the stage.
template <bool kGateUp, int KH, int XR>
struct Feeder8 : WeightFeed<kGateUp, Shape<KH, XR, true>> {
  using Sh = Shape<KH, XR, true>;
  static constexpr int kX = (XR + 31) / 32;
  const uint8_t* x[kX];  // null: zeros
  bool fill[kX];
  const float* xs;       // block scales: the thread's token's scale row (t < XR); null: zeros
  bool xs_fill;
  uint64_t pol_x;

  __device__ __forceinline__ void set_pass(const Args& a, const moe_gemm::Unit& un, int pass) {
    const int live = min(XR, un.n_e - pass * XR), rows = (live + 7) & ~7;
    const uint8_t* x8 = static_cast<const uint8_t*>(a.x);
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      const int n = (threadIdx.x >> 3) + 32 * i;
      fill[i] = n < rows;
      x[i] = n < live ? x8 + int64_t(un.begin + pass * XR + n) * a.K : nullptr;
    }
    const int n = threadIdx.x;
    xs_fill = a.block_scales && n < rows;
    xs = a.block_scales && n < live ? a.xs + int64_t(un.begin + pass * XR + n) * ((a.K + kBK - 1) / kBK) : nullptr;
  }
  __device__ __forceinline__ void load_x(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 16 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      if (!fill[i]) continue;
      const int n = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && x[i] != nullptr;
      moe_gemm::cp16<false>(stage + Sh::kTileW + woff(n, c), live ? static_cast<const void*>(x[i] + k) : a.x, live,
                            pol_x);
    }
    if (xs_fill)
      cp4(stage + Sh::kTileW + XR * kBK + 4 * threadIdx.x, xs ? static_cast<const void*>(xs + ks) : a.xs, xs != nullptr);
  }
};

template <typename T, bool kGateUp, int KH, int XR>
struct Feeder : WeightFeed<kGateUp, Shape<KH, XR>> {
  using Sh = Shape<KH, XR>;
  static constexpr int kX = (XR + 15) / 16;  // token rows per thread (XR = 8: threads 0..127)
  const T* x[kX];                            // token rows (t / 16 + 16 i); null: zeros
  bool fill[kX];                             // whether the token row is written at all (rows of live n8 tiles)
  uint64_t pol_x;

  __device__ __forceinline__ void set_pass(const Args& a, const moe_gemm::Unit& un, int pass) {
    const int live = min(XR, un.n_e - pass * XR), rows = (live + 7) & ~7;
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      const int n = (threadIdx.x >> 4) + 16 * i, slot = un.begin + pass * XR + n;
      fill[i] = n < rows;
      x[i] = nullptr;
      if (n < live) {
        const int64_t src = kGateUp ? int64_t(__ldcg(a.src_token + slot)) : int64_t(slot);
        x[i] = static_cast<const T*>(a.x) + src * a.K;
      }
    }
  }
  __device__ __forceinline__ void load_x(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 15;
    const int64_t k = int64_t(ks) * kBK + 8 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      if (!fill[i]) continue;
      const int n = (threadIdx.x >> 4) + 16 * i;
      const bool live = kin && x[i] != nullptr;
      moe_gemm::cp16<false>(stage + Sh::kTileW + xoff<KH>(n, c), live ? static_cast<const void*>(x[i] + k) : a.x,
                            live, pol_x);
    }
  }
};

__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void lds64(uint32_t (&v)[2], uint32_t a) {
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v[0]), "=r"(v[1]) : "r"(a) : "memory");
}
__device__ __forceinline__ void lds128(uint32_t* v, uint32_t a) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(a)
               : "memory");
}

// The lane's A fragments of the stage's weight tile (rows 32 rg + 16 m + 8 h + g, its bytes from
// byte on), e4m3 widened to T as widen says (kWidenBits, kWidenCvt, or the raw pairs).
template <typename T, int KH, int XR>
__device__ __forceinline__ void weight_frags(uint32_t (&af)[2][Shape<KH, XR>::kSteps][4], uint32_t wt, int rg, int g,
                                             int byte, int widen) {
  constexpr int kS = Shape<KH, XR>::kSteps;
  uint32_t raw[2][2][kS];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t at = wt + woff(32 * rg + 16 * m + 8 * h + g, byte >> 4) + (byte & 15);
      if constexpr (kS == 4)
        lds128(raw[m][h], at);
      else
        raw[m][h][0] = lds32(at);
    }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if (widen == kWidenBits) {
        af[m][s][0] = widen_bits<T, 0>(raw[m][0][s]);
        af[m][s][1] = widen_bits<T, 0>(raw[m][1][s]);
        af[m][s][2] = widen_bits<T, 1>(raw[m][0][s]);
        af[m][s][3] = widen_bits<T, 1>(raw[m][1][s]);
      } else if (widen == kWidenCvt) {
        af[m][s][0] = widen_cvt<T, 0>(raw[m][0][s]);
        af[m][s][1] = widen_cvt<T, 0>(raw[m][1][s]);
        af[m][s][2] = widen_cvt<T, 1>(raw[m][0][s]);
        af[m][s][3] = widen_cvt<T, 1>(raw[m][1][s]);
      } else {
        af[m][s][0] = raw[m][0][s];
        af[m][s][1] = raw[m][1][s];
        af[m][s][2] = raw[m][0][s] >> 16;
        af[m][s][3] = raw[m][1][s] >> 16;
      }
    }
}

// The bench's ungrouped order: one token tile at a time, the same arithmetic as stage_mma's groups.
template <typename T, int KH, int XR>
__device__ __forceinline__ void mma_ungrouped(float (&acc)[2][XR / 8][4],
                                              const uint32_t (&af)[2][Shape<KH, XR>::kSteps][4], uint32_t xt, int g,
                                              int xb, int nt, const float (&sc)[2], bool blocks) {
  using Sh = Shape<KH, XR>;
  constexpr int kS = Sh::kSteps;
#pragma unroll
  for (int t = 0; t < Sh::kNT; ++t) {
    if (t < nt) {
      const int n = 8 * t + g;
      uint32_t b[2 * kS];
      if constexpr (kS == 4) {
        lds128(b, xt + xoff<KH>(n, xb >> 4));
        lds128(b + 4, xt + xoff<KH>(n, (xb >> 4) + 1));
      } else {
        lds64(*reinterpret_cast<uint32_t(*)[2]>(b), xt + xoff<KH>(n, xb >> 4) + (xb & 15));
      }
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        if (blocks) {
          float p[4];
          mma_first<T>(p, af[m][0], b[0], b[1]);
#pragma unroll
          for (int s = 1; s < kS; ++s)
            gemv::mma16816<T>(p, af[m][s][0], af[m][s][1], af[m][s][2], af[m][s][3], b[2 * s], b[2 * s + 1]);
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[m][t][c] = fmaf(sc[m], p[c], acc[m][t][c]);
        } else {
#pragma unroll
          for (int s = 0; s < kS; ++s)
            gemv::mma16816<T>(acc[m][t], af[m][s][0], af[m][s][1], af[m][s][2], af[m][s][3], b[2 * s], b[2 * s + 1]);
        }
      }
    }
  }
}

// The warp's stage: acc[m][t] += W[rows 32 rg + 16 m, +16) . X[tokens 8 t, +8) over its k slice of
// the stage, t < nt; with block scales (sc non-null) the slice's sum times sc[m].
template <typename T, int KH, int XR>
__device__ __forceinline__ void stage_mma(float (&acc)[2][XR / 8][4], uint32_t wt, uint32_t xt, int rg, int kh, int nt,
                                          const float (&sc)[2], bool blocks, int widen, bool ungrouped) {
  using Sh = Shape<KH, XR>;
  constexpr int kS = Sh::kSteps;
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int byte = kh * Sh::kSlice + q * Sh::kLaneB;  // the lane's first e4m3 byte (= k) in the stage
  uint32_t af[2][kS][4];
  weight_frags<T, KH, XR>(af, wt, rg, g, byte, widen);
  const int xb = 2 * byte;  // the token row's first byte of the lane (16-bit k)
  // token tiles in groups of kG, the steps outermost inside a group: 2 kG independent mma chains
  // in flight instead of 2 (a chain's steps wait on each other's accumulators); ungrouped (bench):
  // one tile at a time, the same arithmetic
  constexpr int kG = Sh::kNT < 4 ? Sh::kNT : 4;
  if (ungrouped) {
    mma_ungrouped<T, KH, XR>(acc, af, xt, g, xb, nt, sc, blocks);
    return;
  }
#pragma unroll
  for (int t0 = 0; t0 < Sh::kNT; t0 += kG) {
    if (t0 < nt) {
      uint32_t b[kG][2 * kS];
#pragma unroll
      for (int u = 0; u < kG; ++u) {
        if (t0 + u < nt) {
          const int n = 8 * (t0 + u) + g;
          if constexpr (kS == 4) {
            lds128(b[u], xt + xoff<KH>(n, xb >> 4));
            lds128(b[u] + 4, xt + xoff<KH>(n, (xb >> 4) + 1));
          } else {
            lds64(*reinterpret_cast<uint32_t(*)[2]>(b[u]), xt + xoff<KH>(n, xb >> 4) + (xb & 15));
          }
        }
      }
      if (blocks) {
        float p[2][kG][4];
#pragma unroll
        for (int s = 0; s < kS; ++s)
#pragma unroll
          for (int u = 0; u < kG; ++u)
            if (t0 + u < nt)
#pragma unroll
              for (int m = 0; m < 2; ++m) {
                if (s == 0)
                  mma_first<T>(p[m][u], af[m][0], b[u][0], b[u][1]);
                else
                  gemv::mma16816<T>(p[m][u], af[m][s][0], af[m][s][1], af[m][s][2], af[m][s][3], b[u][2 * s],
                                    b[u][2 * s + 1]);
              }
#pragma unroll
        for (int u = 0; u < kG; ++u)
          if (t0 + u < nt)
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[m][t0 + u][c] = fmaf(sc[m], p[m][u][c], acc[m][t0 + u][c]);
      } else {
#pragma unroll
        for (int s = 0; s < kS; ++s)
#pragma unroll
          for (int u = 0; u < kG; ++u)
            if (t0 + u < nt)
#pragma unroll
              for (int m = 0; m < 2; ++m)
                gemv::mma16816<T>(acc[m][t0 + u], af[m][s][0], af[m][s][1], af[m][s][2], af[m][s][3], b[u][2 * s],
                                  b[u][2 * s + 1]);
      }
    }
  }
}

// F8 (KH = 2): the warp's stage, e4m3 x e4m3. Lane (g, q) reads its rows' 16 bytes at k kh 64 + 16 q
// (words s = k + 4 s: step j takes words 2 j (the instruction's k 4 q..) and 2 j + 1 (its k 16 + 4 q..))
// and its token row's 16 bytes at the same k, so every step multiplies matching k. Block scales: each
// step pair an mma chain from zero, added times the weight block's scale and the token's.
template <int XR>
__device__ __forceinline__ void stage_mma_f8(float (&acc)[2][XR / 8][4], uint32_t wt, uint32_t xt, int rg, int kh,
                                             int nt, const float (&sc)[2], bool blocks) {
  constexpr int kNT = XR / 8;
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int chunk = 4 * kh + q;
  uint32_t a[2][2][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) lds128(a[m][h], wt + woff(32 * rg + 16 * m + 8 * h + g, chunk));
  constexpr int kG = kNT < 4 ? kNT : 4;
#pragma unroll
  for (int t0 = 0; t0 < kNT; t0 += kG) {
    if (t0 < nt) {
      uint32_t b[kG][4];
#pragma unroll
      for (int u = 0; u < kG; ++u)
        if (t0 + u < nt) lds128(b[u], xt + woff(8 * (t0 + u) + g, chunk));
      if (blocks) {
#pragma unroll
        for (int u = 0; u < kG; ++u) {
          if (t0 + u < nt) {
            uint32_t sxw[2];
            lds64(sxw, xt + XR * kBK + 4 * (8 * (t0 + u) + 2 * q));
            const float sx[2] = {__uint_as_float(sxw[0]), __uint_as_float(sxw[1])};
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int j = 0; j < 2; ++j)
                mma_e4m3(p, a[m][0][2 * j], a[m][1][2 * j], a[m][0][2 * j + 1], a[m][1][2 * j + 1], b[u][2 * j],
                         b[u][2 * j + 1]);
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[m][t0 + u][c] = fmaf(sc[m] * sx[c & 1], p[c], acc[m][t0 + u][c]);
            }
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int u = 0; u < kG; ++u)
            if (t0 + u < nt)
#pragma unroll
              for (int m = 0; m < 2; ++m)
                mma_e4m3(acc[m][t0 + u], a[m][0][2 * j], a[m][1][2 * j], a[m][0][2 * j + 1], a[m][1][2 * j + 1],
                         b[u][2 * j], b[u][2 * j + 1]);
      }
    }
  }
}

// The output feature of the lane's accumulator rows [m][c / 2] (gate/up: m = 0 gate row j, m = 1
// up row R + j: the feature j of both).
template <bool kGateUp, int kRows>
__device__ __forceinline__ int64_t acc_feature(const moe_gemm::Unit& un, int rg, int m, int h) {
  const int r = gemv::acc_row(threadIdx.x & 31, 2 * h);
  return kGateUp ? un.tile * 64 + 16 * rg + r : un.tile * kRows + 32 * rg + 16 * m + r;
}

// The block128 scale rows of the warp's two m-tiles in unit `un` (null: the tile is past the end).
template <bool kGateUp, int kRows>
__device__ __forceinline__ void scale_rows(const float* (&sp)[2], const Args& a, const moe_gemm::Unit& un, int rg) {
  const int64_t kb = (a.K + 127) / 128, rb1 = (a.R + 127) / 128, rb = (kGateUp ? 2 : 1) * rb1;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int64_t f = kGateUp ? un.tile * 64 + 16 * rg : un.tile * kRows + 32 * rg + 16 * m;
    const int64_t b = (kGateUp && m == 1 ? rb1 : 0) + f / 128;
    sp[m] = f < a.R ? a.s + (int64_t(un.e) * rb + b) * kb : nullptr;
  }
}

// The end of a (unit, pass) for a warp kh = 0 (the other slices already added): the accumulators,
// times the channel scales, to act (gate/up, SwiGLU) or out (down / dense).
template <typename T, bool kGateUp, int KH, int XR, bool kF8>
__device__ __forceinline__ void store_tile(const Args& a, const float (&acc)[2][XR / 8][4], const moe_gemm::Unit& un,
                                           int pass, int rg, int nt) {
  using Sh = Shape<KH, XR, kF8>;
  const int lane = threadIdx.x & 31;
  // the rows of the lane's accumulators [m][c / 2] and their channel scales (block128: 1)
  const float* se = a.s + int64_t(un.e) * (kGateUp ? 2 : 1) * a.R;
  int64_t feat[2][2];
  float rs[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      feat[m][h] = acc_feature<kGateUp, Sh::kRows>(un, rg, m, h);
      rs[m][h] = 1.f;
      if (!a.block_scales && feat[m][h] < a.R) rs[m][h] = __ldg(se + (kGateUp && m == 1 ? a.R : 0) + feat[m][h]);
    }
  // += into fp32: every old value loaded before any store (the compiler may not move a load past a
  // store that could alias it: one memory latency per element otherwise)
  float prev[2][Sh::kNT][4] = {};
  if (!kGateUp && a.out_mode == kOutAddF32) {
#pragma unroll
    for (int t = 0; t < Sh::kNT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int slot = pass * XR + 8 * t + gemv::acc_col(lane, c);
        if (t >= nt || slot >= un.n_e) continue;
        const int64_t row = un.begin + slot;
#pragma unroll
        for (int m = 0; m < 2; ++m)
          if (feat[m][c >> 1] < a.R) prev[m][t][c] = static_cast<const float*>(a.out)[row * a.R + feat[m][c >> 1]];
      }
  }
#pragma unroll
  for (int t = 0; t < Sh::kNT; ++t) {
    if (t < nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int slot = pass * XR + 8 * t + gemv::acc_col(lane, c);
        if (slot >= un.n_e) continue;
        const int64_t row = un.begin + slot;
        const int h = c >> 1;
        // F8, channel: the token's scale (block128: in the sums already)
        const float sx = kF8 && !a.block_scales ? __ldg(a.xs + row) : 1.f;
        if constexpr (kGateUp) {
          const int64_t j = feat[0][h];
          const float gv = acc[0][t][c] * rs[0][h] * sx, u = acc[1][t][c] * rs[1][h] * sx;
          const float v = gv / (1.0f + expf(-gv)) * u;
          if (j < a.R) {
            if constexpr (kF8)
              static_cast<float*>(a.out)[row * a.R + j] = v;
            else
              static_cast<T*>(a.out)[row * a.R + j] = from_f32<T>(v);
          }
        } else {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int64_t f = feat[m][h];
            if (f >= a.R) continue;
            const float v = acc[m][t][c] * rs[m][h] * sx;
            if (a.out_mode == kOutT)
              static_cast<T*>(a.out)[row * a.R + f] = from_f32<T>(v);
            else if (a.out_mode == kOutF32)
              static_cast<float*>(a.out)[row * a.R + f] = v;
            else
              static_cast<float*>(a.out)[row * a.R + f] = prev[m][t][c] + v;
          }
        }
      }
    }
  }
}

// The experts the block's units walk into s_off / s_touched / s_count: the routed step's touched
// experts (gate/up first waits for the routing), or one "expert" of a.dense_rows rows.
template <bool kGateUp>
__device__ __forceinline__ void block_experts(const Args& a, int* s_off, int* s_touched, int& s_count, int tid) {
  if (a.dense_rows > 0) {
    if (tid == 0) {
      s_off[0] = 0;
      s_off[1] = a.dense_rows;
      s_touched[0] = 0;
      s_count = 1;
    }
    __syncthreads();
  } else {
    if constexpr (kGateUp) moe_gemm::griddep_wait();
    moe_gemm::load_touched(a.offsets, a.n_experts, s_off, s_touched, s_count);
  }
}

// The k-split warps' sums of a pass: a warp kh > 0 leaves its acc in red (its own place: red's
// [warp (kh - 1) kRG + rg][element][lane]) ...
template <int NT>
__device__ __forceinline__ void stash_k_sums(float* red, const float (&acc)[2][NT][4], int nt) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[((m * NT + t) * 4 + c) * 32] = acc[m][t][c];
}
// ... and a warp kh = 0 adds those of its row group, in kh order.
template <int KH, int NT, int kRG>
__device__ __forceinline__ void add_k_sums(float (&acc)[2][NT][4], const float* red, int rg, int lane, int nt) {
  constexpr int kWarpRed = 8 * NT * 32;
#pragma unroll 1
  for (int j = 1; j < KH; ++j) {
    const float* r = red + ((j - 1) * kRG + rg) * kWarpRed + lane;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[m][t][c] += r[((m * NT + t) * 4 + c) * 32];
  }
}

template <int NT>
__device__ __forceinline__ void zero_sums(float (&acc)[2][NT][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][t][c] = 0.f;
}

// The warp's two m-tiles' block128 scales at k step k (scale_rows' rows; 0 for a tile past the end);
// 1 with channel scales, which the store applies.
__device__ __forceinline__ void k_scales(float (&sc)[2], const float* const (&sp)[2], int k, bool blocks) {
  sc[0] = sc[1] = 1.f;
  if (blocks) {
#pragma unroll
    for (int m = 0; m < 2; ++m) sc[m] = sp[m] ? __ldg(sp[m] + k) : 0.f;
  }
}

// One stage's products into acc: e4m3 tokens (stage_mma_f8), or T tokens (stage_mma, with Args'
// widening of the e4m3 weights and the bench's ungrouped order).
template <typename T, int KH, int XR, bool kF8, int NT>
__device__ __forceinline__ void stage_product(float (&acc)[2][NT][4], uint32_t w, uint32_t x, int rg, int kh, int nt,
                                              const float (&sc)[2], bool blocks, const Args& a) {
  if constexpr (kF8)
    stage_mma_f8<XR>(acc, w, x, rg, kh, nt, sc, blocks);
  else
    stage_mma<T, KH, XR>(acc, w, x, rg, kh, nt, sc, blocks, a.widen, (a.variant & 1) != 0);
}

// The end of a pass: warps kh > 0 leave their sums in red (mine: this warp's place), warps kh = 0
// add them in kh order and store the tile; then every warp's sums are zeroed. The stage is free once
// every warp is done with it (kAlias: red is the stage just consumed; the producer refills it only
// after the next iteration's barrier, when warps kh = 0 have read the sums).
template <typename T, bool kGateUp, int KH, int XR, bool kF8, bool kAlias, int kRG, int NT>
__device__ __forceinline__ void end_pass(const Args& a, float (&acc)[2][NT][4], const float* red, float* mine,
                                         const moe_gemm::Unit& un, int pass, int rg, int kh, int lane, int nt) {
  if constexpr (kAlias) __syncthreads();
  if (kh > 0) stash_k_sums<NT>(mine, acc, nt);
  __syncthreads();
  if (kh == 0) {
    add_k_sums<KH, NT, kRG>(acc, red, rg, lane, nt);
    store_tile<T, kGateUp, KH, XR, kF8>(a, acc, un, pass, rg, nt);
  }
  zero_sums(acc);
}

// The consumer on to its next pass (and unit, with its scale rows); the pass's live n8 token tiles.
template <bool kGateUp, int XR, int kRows>
__device__ __forceinline__ int next_pass(moe_gemm::StageWalk& cw, const float* (&sp)[2], const Args& a, UnitRing& ring,
                                         bool taken, int64_t u_end, int64_t tiles, const int* s_touched,
                                         const int* s_off, int rg) {
  cw.k = 0;
  if (++cw.pass >= cw.un.passes) {
    cw.pass = 0;
    cw.u = taken ? ring.consumer_next() : cw.u + 1;
    if (cw.u < u_end) {
      cw.un = unit_of<XR>(cw.u, tiles, s_touched, s_off);
      scale_rows<kGateUp, kRows>(sp, a, cw.un, rg);
    }
  }
  return (min(XR, cw.un.n_e - cw.pass * XR) + 7) / 8;
}

// The decode expert products with mma.sync (gate/up with the SwiGLU, or down): a block walks its
// share of the touched experts' units (unit_of: an expert's tile of output rows, passes of XR token
// slots) through an S-stage cp.async pipeline, producer and consumer in every thread. The block's
// units come in ascending order: fixed (a.ctr null), [units b / grid, units (b + 1) / grid); taken
// (a.ctr), UnitRing's, so that blocks freeing up spread the weight stream's uneven per-SM rates
// (blocks with a fixed share idle up to ~20 % of the kernel at its end). KH warps split each stage's
// k; end_pass adds their sums.
template <typename T, bool kGateUp, int KH, int XR, bool kF8, int BPS = 1>
__global__ void __launch_bounds__(kThreads, BPS) moe_gemm_fp8_kernel(const Args a) {
  using Sh = Shape<KH, XR, kF8, BPS>;
  static_assert(!kF8 || KH == 2, "F8: 128-row units");
  constexpr int S = Sh::kStages, NT = Sh::kNT;
  static_assert(!kGateUp || KH == 2, "gate/up pairs the 64 j of a 128-row unit");
  extern __shared__ __align__(128) unsigned char smem[];
  float* const red_fixed = reinterpret_cast<float*>(smem + S * Sh::kStage);  // red beside the stages (!kAlias)
  int* s_off = reinterpret_cast<int*>(smem + S * Sh::kStage + (Sh::kAlias ? 0 : Sh::kRed));
  int *s_touched = s_off + a.n_experts + 1, &s_count = s_off[2 * kMaxExperts + 3];
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, rg = warp % Sh::kRG, kh = warp / Sh::kRG;

  block_experts<kGateUp>(a, s_off, s_touched, s_count, tid);
  // gate/up lets its dependent (down, or F8 act's quantization) launch once it has the offsets (bench
  // variant 16, F8: at its end, so that the quantization's blocks never wait beside it)
  const bool late_launch = kF8 && (a.variant & 16) != 0;
  if (kGateUp && !late_launch) moe_gemm::griddep_launch();

  const int64_t tiles = kGateUp ? (a.R + 63) / 64 : (a.R + Sh::kRows - 1) / Sh::kRows;
  const int64_t units = int64_t(s_count) * tiles;
  const bool taken = a.ctr != nullptr;
  UnitRing ring(a.ctr, s_off + 2 * kMaxExperts + 4);
  const int64_t u_end = taken ? units : units * (blockIdx.x + 1) / gridDim.x;
  int64_t pu = taken ? int64_t(blockIdx.x) : units * blockIdx.x / gridDim.x;
  if (pu >= u_end) {
    if constexpr (!kGateUp) moe_gemm::griddep_wait();
    return;
  }
  const int nk = int((a.K + kBK - 1) / kBK);
  const bool blocks = a.block_scales != 0;
  std::conditional_t<kF8, Feeder8<kGateUp, KH, XR>, Feeder<T, kGateUp, KH, XR>> feed;
  moe_gemm::l2_policies(a.l2_hints != 0, feed.pol_w, feed.pol_x);
  moe_gemm::StageWalk pw{pu, unit_of<XR>(pu, tiles, s_touched, s_off)};  // the producer's
  feed.set_unit(a, pw.un);
  feed.set_pass(a, pw.un, 0);
  auto load = [&](int slot, int k, bool w, bool x) {
    if (w) feed.load_w(a, base + slot * Sh::kStage, k);
    if (x) feed.load_x(a, base + slot * Sh::kStage, k);
  };
  auto advance = [&]() {  // the producer one stage on
    if (++pw.k < nk) return;
    pw.k = 0;
    if (++pw.pass >= pw.un.passes) {
      pw.pass = 0;
      pw.u = taken ? ring.producer_next() : pw.u + 1;
      if (pw.u >= u_end) return;
      pw.un = unit_of<XR>(pw.u, tiles, s_touched, s_off);
      feed.set_unit(a, pw.un);
    }
    feed.set_pass(a, pw.un, pw.pass);
  };
  moe_gemm::fill_pipeline<kGateUp, S>(pw, u_end, nk, load, advance);

  const int64_t first = taken ? int64_t(blockIdx.x) : units * blockIdx.x / gridDim.x;  // pu has moved on
  moe_gemm::StageWalk cw{first, unit_of<XR>(first, tiles, s_touched, s_off)};  // the consumer's
  const float* sp[2];
  scale_rows<kGateUp, Sh::kRows>(sp, a, cw.un, rg);
  int nt = (min(XR, cw.un.n_e) + 7) / 8;
  int slot_c = 0, slot_p = S - 1;
  float acc[2][NT][4] = {};
  const int my_red = (kh > 0 ? (kh - 1) * Sh::kRG + rg : 0) * (8 * NT * 32) + lane;  // end_pass's place in red
  while (cw.u < u_end) {
    moe_gemm::wait_pending<S - 2>();  // this thread's copies of stage slot_c have landed
    __syncthreads();                  // everyone's have, and everyone is done with slot_p
    slot_p = moe_gemm::refill_stage<S>(pw, u_end, slot_p, load, advance);
    float sc[2];
    k_scales(sc, sp, cw.k, blocks);
    const uint32_t st = base + slot_c * Sh::kStage;
    stage_product<T, KH, XR, kF8>(acc, st, st + Sh::kTileW, rg, kh, nt, sc, blocks, a);
    float* const red = Sh::kAlias ? reinterpret_cast<float*>(smem + slot_c * Sh::kStage) : red_fixed;
    slot_c = slot_c + 1 == S ? 0 : slot_c + 1;
    if (++cw.k == nk) {
      end_pass<T, kGateUp, KH, XR, kF8, Sh::kAlias, Sh::kRG>(a, acc, red, red + my_red, cw.un, cw.pass, rg, kh, lane,
                                                             nt);
      nt = next_pass<kGateUp, XR, Sh::kRows>(cw, sp, a, ring, taken, u_end, tiles, s_touched, s_off, rg);
    }
  }
  moe_gemm::wait_pending<0>();
  if (!kGateUp || late_launch) moe_gemm::griddep_launch();
}

}  // namespace lfm2::cuda::moe_gemm_fp8
