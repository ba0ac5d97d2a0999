// The decode products on FP8 weights (docs/fp8.md): moe_decode_gemm.cuh's persistent pipelined
// grouped GEMM with e4m3 weight tiles. Each touched expert's e4m3 weights are streamed once (half
// the bytes of bf16) through the same multi-stage cp.async pipeline; per stage the block widens the
// kBM x 64 e4m3 tile to 16-bit in one shared buffer, multiplying each weight by its scale
// (w = T(e4m3 * scale), the scale of its row or of its 128 x 128 block), and the warps multiply it
// with mma.sync m16n8k16 exactly as the bf16 kernel does (fp32 accumulation, swap-AB).
//
// A stage: the e4m3 tile (kBM rows of 64 bytes, 16-byte chunks in row order), the token tile (kTB
// rows of 64 16-bit k, swizzled as in moe_decode_gemm.cuh) and the kBM scales of the stage's k block
// (4-byte cp.async beside the tile, so they land with it). The widened tile has the bf16 kernel's
// layout (kBM rows of 128 bytes, XOR-swizzled), read by ldmatrix; there are two, so that the block
// widens stage i + 1 while its warps multiply stage i, with one barrier a stage.
//
// Units, passes, the producer/consumer walk, PDL and exactness are moe_decode_gemm.cuh's: an output
// element is the sum over 64-k stages in ascending k of four mma steps from its weight row and
// token row alone, so a row's bits depend only on its input and experts. Dense mode (dense_rows > 0)
// is one "expert" holding every row (the projections of linear_fp8_decode): no offsets are read.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/cuda/moe_decode_gemm.cuh"

namespace lfm2::cuda::moe_gemm_fp8 {

using moe_gemm::kBK;
using moe_gemm::kBM;
using moe_gemm::kMaxExperts;
using moe_gemm::kTB;
using moe_gemm::kThreads;
using moe_gemm::kWarps;

constexpr int kTileQ = kBM * kBK;                 // e4m3 tile, 8 KB
constexpr int kTileX = kTB * kBK * 2;             // token tile, 8 KB
constexpr int kStageBytes = kTileQ + kTileX + kBM * 4;
constexpr int kWideBytes = kBM * kBK * 2;         // the widened 16-bit tile, 16 KB

// S stages, two widened tiles (the current stage's, being multiplied, and the next one's, being
// widened), offsets and the touched list.
constexpr int smem_bytes(int stages) { return stages * kStageBytes + 2 * kWideBytes + (2 * kMaxExperts + 4) * 4; }

enum OutMode { kOutT = 0, kOutF32 = 1, kOutAddF32 = 2 };

struct Args {
  const uint8_t* w;          // (E, rows, K) e4m3: gate/up w13 (rows 2 R: w1 rows then w3 rows), down w2 / dense (R)
  const float* s;            // scales (E, row blocks, k blocks): see row_block
  const void* x;             // gate/up: in (n_tokens, K); down: act or the dense rows (P, K), T
  const int32_t* offsets;    // (E + 1); null in dense mode
  const int32_t* src_token;  // (P), gate/up only
  void* out;                 // gate/up: act (P, R) T; down: (P, R) by out_mode
  int64_t K, R;
  int n_experts;
  int dense_rows;            // > 0: dense mode, P = dense_rows rows of x, one expert
  int block_scales;          // 1: 128 x 128 blocks; 0: one scale per row
  int out_mode;              // down only: OutMode
  int l2_hints;
  int widen = 1;             // 0: skip the widening (timing only: wrong results; the pipeline's bound)
};

// The scale row of weight row `row` of an expert whose matrix is [first R1 rows; the rest]
// (gate/up: w1 then w3, each with its own blocks; down: R1 = all rows).
__device__ __forceinline__ int64_t row_block(int64_t row, int64_t r1, bool blocks) {
  if (!blocks) return row;
  return row < r1 ? row / 128 : (r1 + 127) / 128 + (row - r1) / 128;
}

__device__ __forceinline__ void cp4(uint32_t dst, const void* src, bool live) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 4 : 0) : "memory");
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two e4m3 (the low 16 bits of v, element 0 first) to float: exact (e4m3 is a subset of fp16).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

template <typename T, bool kGateUp>
struct Feeder {
  const uint8_t* w[2];  // the thread's two weight rows (t / 4 + 64 i); null past the end
  const float* s[2];    // their scale rows
  const T* x[2];
  bool fill[2];
  uint64_t pol_w, pol_x;

  __device__ __forceinline__ void set_unit(const Args& a, const moe_gemm::Unit& un) {
    const int64_t rows = (kGateUp ? 2 : 1) * a.R;
    const uint8_t* we = a.w + int64_t(un.e) * rows * a.K;
    const int64_t kb = a.block_scales ? (a.K + 127) / 128 : 1;
    const int64_t rb = a.block_scales ? (kGateUp ? 2 * ((a.R + 127) / 128) : (a.R + 127) / 128) : rows;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (threadIdx.x >> 2) + 64 * i;
      int64_t f, row;
      if constexpr (kGateUp) {
        f = un.tile * 64 + 16 * (r >> 5) + (r & 15);
        row = ((r >> 4) & 1) * a.R + f;
      } else {
        f = un.tile * kBM + r;
        row = f;
      }
      w[i] = f < a.R ? we + row * a.K : nullptr;
      s[i] = a.s + (int64_t(un.e) * rb + row_block(row, a.R, a.block_scales != 0)) * kb;
    }
  }
  __device__ __forceinline__ void set_pass(const Args& a, const moe_gemm::Unit& un, int pass) {
    const int live = min(kTB, un.n_e - pass * kTB), rows = (live + 7) & ~7;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int n = (threadIdx.x >> 3) + 32 * i, slot = un.begin + pass * kTB + n;
      fill[i] = n < rows;
      x[i] = nullptr;
      if (n < live) {
        const int64_t src = kGateUp ? int64_t(__ldcg(a.src_token + slot)) : int64_t(slot);
        x[i] = static_cast<const T*>(a.x) + src * a.K;
      }
    }
  }
  // The e4m3 chunks (16 k each) of the thread's rows and, by one thread of each row, its scale.
  __device__ __forceinline__ void load_w(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 3;
    const int64_t k = int64_t(ks) * kBK + 16 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (threadIdx.x >> 2) + 64 * i;
      const bool live = kin && w[i] != nullptr;
      moe_gemm::cp16<true>(stage + uint32_t(r * kBK + 16 * c), live ? static_cast<const void*>(w[i] + k) : a.w, live,
                           pol_w);
      if (c == 0) {
        const bool sl = w[i] != nullptr;
        cp4(stage + kTileQ + kTileX + 4 * r, sl ? static_cast<const void*>(s[i] + (a.block_scales ? ks / 2 : 0)) : a.s,
            sl);
      }
    }
  }
  __device__ __forceinline__ void load_x(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 8 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!fill[i]) continue;
      const int n = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && x[i] != nullptr;
      moe_gemm::cp16<false>(stage + kTileQ + moe_gemm::swz(n, c), live ? static_cast<const void*>(x[i] + k) : a.x,
                            live, pol_x);
    }
  }
};

// The stage's e4m3 tile times its scales into the widened tile: thread t takes chunks t and t + 256
// (row c / 4, 16 k from 16 (c % 4)). A row past the end has scale 0 copied as zeros: it stays 0.
template <typename T>
__device__ __forceinline__ void widen(const unsigned char* stage, unsigned char* wide) {
  const float* sc = reinterpret_cast<const float*>(stage + kTileQ + kTileX);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = threadIdx.x + kThreads * i, r = c >> 2, q = c & 3;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kBK + 16 * q);
    const float s = sc[r];
    const uint32_t in[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 lo = e4m3x2_to_float2(in[j]), hi = e4m3x2_to_float2(in[j] >> 16);
      o[2 * j] = pack2<T>(lo.x * s, lo.y * s);
      o[2 * j + 1] = pack2<T>(hi.x * s, hi.y * s);
    }
    *reinterpret_cast<uint4*>(wide + moe_gemm::swz(r, 2 * q)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(wide + moe_gemm::swz(r, 2 * q + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// moe_gemm::stage_mma with the weights from the widened tile and the tokens from the stage.
template <typename T>
__device__ __forceinline__ void stage_mma(float (&acc)[2][4][4], uint32_t wide, uint32_t xt, int rg, int th, int nt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t af[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int row = 32 * rg + 16 * m + (lane & 7) + 8 * ((lane >> 3) & 1);
      moe_gemm::ldsm_x4(af[m], wide + moe_gemm::swz(row, 2 * kk + (lane >> 4)));
    }
    uint32_t bf[4][2];
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      if (2 * np < nt) {
        const int tok = 8 * (4 * np + th + 2 * (lane >> 4)) + (lane & 7);
        uint32_t r[4];
        moe_gemm::ldsm_x4(r, xt + moe_gemm::swz(tok, 2 * kk + ((lane >> 3) & 1)));
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (t < nt) {
#pragma unroll
        for (int m = 0; m < 2; ++m)
          gemv::mma16816<T>(acc[m][t], af[m][0], af[m][1], af[m][2], af[m][3], bf[t][0], bf[t][1]);
      }
    }
  }
}

template <typename T, bool kGateUp>
__device__ __forceinline__ void store_tile(const Args& a, float (&acc)[2][4][4], const moe_gemm::Unit& un, int pass,
                                           int rg, int th, int nt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    if (t < nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int slot = pass * kTB + 8 * (2 * t + th) + gemv::acc_col(lane, c);
        if (slot >= un.n_e) continue;
        const int64_t row = un.begin + slot;
        if constexpr (kGateUp) {
          const int64_t j = un.tile * 64 + 16 * rg + gemv::acc_row(lane, c);
          const float g = acc[0][t][c];
          if (j < a.R) static_cast<T*>(a.out)[row * a.R + j] = from_f32<T>(g / (1.0f + expf(-g)) * acc[1][t][c]);
        } else {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int64_t h = un.tile * kBM + 32 * rg + 16 * m + gemv::acc_row(lane, c);
            if (h >= a.R) continue;
            if (a.out_mode == kOutT)
              static_cast<T*>(a.out)[row * a.R + h] = from_f32<T>(acc[m][t][c]);
            else if (a.out_mode == kOutF32)
              static_cast<float*>(a.out)[row * a.R + h] = acc[m][t][c];
            else
              static_cast<float*>(a.out)[row * a.R + h] += acc[m][t][c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][t][c] = 0.f;
}

template <typename T, bool kGateUp, int S>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_fp8_kernel(const Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_count;
  unsigned char* wide = smem + S * kStageBytes;  // two widened tiles
  int* s_off = reinterpret_cast<int*>(wide + 2 * kWideBytes);
  int* s_touched = s_off + a.n_experts + 1;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t wide_s = uint32_t(__cvta_generic_to_shared(wide));
  const int tid = threadIdx.x, warp = tid >> 5, rg = warp & 3, th = warp >> 2;

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
    for (int i = tid; i <= a.n_experts; i += kThreads) s_off[i] = __ldcg(a.offsets + i);
    __syncthreads();
    if (tid < 32) {
      int run = 0;
      for (int b = 0; b < a.n_experts; b += 32) {
        const int e = b + tid;
        const bool used = e < a.n_experts && s_off[e + 1] > s_off[e];
        const unsigned m = __ballot_sync(0xffffffffu, used);
        if (used) s_touched[run + __popc(m & ((1u << tid) - 1u))] = e;
        run += __popc(m);
      }
      if (tid == 0) s_count = run;
    }
    __syncthreads();
  }
  if constexpr (kGateUp) moe_gemm::griddep_launch();

  const int64_t tiles = kGateUp ? (a.R + 63) / 64 : (a.R + kBM - 1) / kBM;
  const int64_t units = int64_t(s_count) * tiles;
  const int64_t u_end = units * (blockIdx.x + 1) / gridDim.x;
  int64_t pu = units * blockIdx.x / gridDim.x;
  if (pu >= u_end) {
    if constexpr (!kGateUp) moe_gemm::griddep_wait();
    return;
  }
  const int nk = int((a.K + kBK - 1) / kBK);

  Feeder<T, kGateUp> feed;
  moe_gemm::l2_policies(a.l2_hints != 0, feed.pol_w, feed.pol_x);
  moe_gemm::Unit pun = moe_gemm::unit_of(pu, tiles, s_touched, s_off);
  feed.set_unit(a, pun);
  feed.set_pass(a, pun, 0);
  int pp = 0, pk = 0;
  auto advance = [&]() {
    if (++pk < nk) return;
    pk = 0;
    if (++pp >= pun.passes) {
      pp = 0;
      if (++pu >= u_end) return;
      pun = moe_gemm::unit_of(pu, tiles, s_touched, s_off);
      feed.set_unit(a, pun);
    }
    feed.set_pass(a, pun, pp);
  };

  int pre = 0;
  if constexpr (!kGateUp) {
    pre = min(S - 1, nk);
    for (int s = 0; s < pre; ++s) feed.load_w(a, base + s * kStageBytes, s);
    moe_gemm::griddep_wait();
  }
  for (int s = 0; s < S - 1; ++s) {
    if (pu < u_end) {
      if (s >= pre) feed.load_w(a, base + s * kStageBytes, pk);
      feed.load_x(a, base + s * kStageBytes, pk);
    }
    moe_gemm::commit();
    if (pu < u_end) advance();
  }

  int64_t cu = units * blockIdx.x / gridDim.x;
  moe_gemm::Unit cun = moe_gemm::unit_of(cu, tiles, s_touched, s_off);
  int cp = 0, ck = 0;
  int nt = moe_gemm::live_tiles(cun, 0, th);
  int slot_c = 0, slot_p = S - 1, wb = 0;
  float acc[2][4][4] = {};
  // The widening runs one stage ahead of the products, into the other tile: one barrier a stage.
  moe_gemm::wait_pending<S - 2>();  // stage 0 landed
  __syncthreads();
  if (a.widen) widen<T>(smem, wide);
  while (cu < u_end) {
    moe_gemm::wait_pending<S - 3>();  // stage slot_c + 1 landed (an empty group past the last)
    __syncthreads();  // wide[wb] is whole; everyone is done with wide[wb ^ 1] and with slot_p
    if (pu < u_end) {
      feed.load_w(a, base + slot_p * kStageBytes, pk);
      feed.load_x(a, base + slot_p * kStageBytes, pk);
    }
    moe_gemm::commit();
    if (pu < u_end) advance();
    slot_p = slot_p + 1 == S ? 0 : slot_p + 1;

    const int slot_n = slot_c + 1 == S ? 0 : slot_c + 1;
    // the next stage's weights (past the block's last stage the slot holds stale bytes: never read)
    if (a.widen) widen<T>(smem + slot_n * kStageBytes, wide + (wb ^ 1) * kWideBytes);
    if (nt > 0) stage_mma<T>(acc, wide_s + wb * kWideBytes, base + slot_c * kStageBytes + kTileQ, rg, th, nt);
    slot_c = slot_n;
    wb ^= 1;
    if (++ck == nk) {
      if (nt > 0) store_tile<T, kGateUp>(a, acc, cun, cp, rg, th, nt);
      ck = 0;
      if (++cp >= cun.passes) {
        cp = 0;
        if (++cu < u_end) cun = moe_gemm::unit_of(cu, tiles, s_touched, s_off);
      }
      nt = moe_gemm::live_tiles(cun, cp, th);
    }
  }
  moe_gemm::wait_pending<0>();
  if constexpr (!kGateUp) moe_gemm::griddep_launch();
}

}  // namespace lfm2::cuda::moe_gemm_fp8
