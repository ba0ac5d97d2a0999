// The FP8 x FP8 decode expert products on Hopper's warpgroup MMA (wgmma e4m3, sm_90a only): the
// persistent cp.async-pipelined grouped GEMM of moe_decode_gemm_fp8.cuh (units, passes, the unit
// counter and ring, PDL) with a wgmma consumer instead of mma.sync (which sm_90 runs on e4m3 as two
// widened fp16 HMMAs: the FP8 rate is wgmma's alone).
//
// A stage is 128 k: the token tile (XR = 8, 16, 32 or 64 slots x 128 bytes) then the e4m3 weight tile
// (128 rows x 128 bytes, 16 KB), both with the 128-byte swizzle (chunk c of row r at c ^ (r & 7)) on
// 1024-byte aligned bases; beside the stages a ring of their scales (block128: the XR tokens' and the
// unit's two weight blocks'). 13 / 12 / 11 / 9 stages (XR 8 / 16 / 32 / 64) as the mma.sync kernel's
// token tile heights. Warpgroup wg multiplies weight rows [64 wg, +64) by 64 token columns: 4 x
// m64n64k32 from zero, the stage's sums then added on the CUDA cores into the fp32 accumulator
// (block128: times the weight block's scale and the token's; channel: as they are, both scales at the
// store), so the tensor core never accumulates more than 128 k.
// - N = 64 always: past the XR slots (and past the live ones) the B rows read the stage's own weight
//   tile or stale tokens, landed data either way; those columns are never stored.
// - gate/up: in each 16-row slab s of the unit, rows 0-7 are gate j = 64 tile + 8 s + i and rows
//   8-15 up of the same j, so a lane's accumulator holds gate j and up j (rows g and g + 8).
//
// Exactness: an output element (feature, token) is a fixed sequence over the stages in ascending k
// of one m64n64k32 chain (4 steps from zero) from its weight row and its token's row alone, added
// into fp32; the instruction never depends on the batch. A row's bits depend on its own input and
// experts only.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe_decode_gemm_fp8.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lfm2::cuda::moe_wgmma_fp8 {

namespace g8 = moe_gemm_fp8;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kBK = 128;
constexpr int kTileW = 128 * kBK;  // 16 KB
constexpr int kFixed = (2 * g8::kMaxExperts + 4 + 32) * 4;  // offsets, touched, count, the unit ring

// XR token slots a pass (the token tile's rows; the instruction's N is 64 whatever XR); BPS blocks
// an SM (2: half the shared memory each, so half the stages).
template <int XR, int BPS = 1>
struct Shape {
  static constexpr int kTileX = XR * kBK;
  static constexpr int kStage = kTileX + kTileW;  // a 1024-byte multiple
  static constexpr int kScales = XR * 4 + 16;     // the tokens' block scales, the two weight blocks'
  static constexpr int kFit = ((BPS == 2 ? g8::kSmemHalf : g8::kSmemMax) - 1024 - kFixed) / (kStage + kScales);
  static constexpr int kStages = kFit < 16 ? kFit : 16;
  static constexpr int kSmem = 1024 + kStages * (kStage + kScales) + kFixed;  // + 1 KB to align the stages
  static_assert(kStages >= 4 && kSmem <= g8::kSmemMax && kStage % 1024 == 0, "the pipeline's shared memory");
};

// The producer side of one thread: chunk t % 8 of weight rows t / 8 + 32 i (i < 4) and of token rows
// t / 8 + 32 i (< XR); block128: thread t < XR token t's scale of the stage, threads 128 and 129 the
// unit's gate and up (down: its one) weight block's.
template <bool kGateUp, int XR>
struct Feeder {
  static constexpr int kX = (XR + 31) / 32;
  const uint8_t* w[4];   // null: past the end, zeros
  const uint8_t* x[kX];  // null: no token (not loaded: its column is never stored)
  const float* xs;       // block scales: the thread's token's scale row; null: none
  const float* ws;       // block scales: the thread's weight block's scale row; null: none
  uint64_t pol_w, pol_x;

  __device__ __forceinline__ void set_unit(const g8::Args& a, const moe_gemm::Unit& un) {
    const int64_t rows = (kGateUp ? 2 : 1) * a.R;
    const uint8_t* we = a.w + int64_t(un.e) * rows * a.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      int64_t f, row;
      if constexpr (kGateUp) {
        f = un.tile * 64 + 8 * (r >> 4) + (r & 7);
        row = ((r >> 3) & 1) * a.R + f;
      } else {
        f = un.tile * 128 + r;
        row = f;
      }
      w[i] = f < a.R ? we + row * a.K : nullptr;
    }
    const int h = int(threadIdx.x) - 128;
    ws = nullptr;
    if (a.block_scales && (h == 0 || h == 1)) {
      const int64_t kb = (a.K + 127) / 128, rb1 = (a.R + 127) / 128, rb = (kGateUp ? 2 : 1) * rb1;
      const int64_t b = kGateUp ? un.tile * 64 / 128 : un.tile;
      ws = a.s + (int64_t(un.e) * rb + (kGateUp && h == 1 ? rb1 : 0) + b) * kb;
    }
  }
  __device__ __forceinline__ void set_pass(const g8::Args& a, const moe_gemm::Unit& un, int pass) {
    const int live = min(XR, un.n_e - pass * XR);
    const uint8_t* x8 = static_cast<const uint8_t*>(a.x);
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      const int n = (threadIdx.x >> 3) + 32 * i;
      x[i] = n < live ? x8 + int64_t(un.begin + pass * XR + n) * a.K : nullptr;
    }
    const int n = threadIdx.x;
    xs = a.block_scales && n < live ? a.xs + int64_t(un.begin + pass * XR + n) * ((a.K + kBK - 1) / kBK) : nullptr;
  }
  // the weight tile at stage + kTileX (and its block scales into the stage's scales)
  __device__ __forceinline__ void load_w(const g8::Args& a, uint32_t stage, uint32_t scales, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 16 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && w[i] != nullptr;
      moe_gemm::cp16<true>(stage + Shape<XR>::kTileX + moe_gemm::swz(r, c),
                           live ? static_cast<const void*>(w[i] + k) : a.w, live, pol_w);
    }
    if (ws) g8::cp4(scales + 4 * (XR + threadIdx.x - 128), ws + ks, true);
  }
  __device__ __forceinline__ void load_x(const g8::Args& a, uint32_t stage, uint32_t scales, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 16 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      if (x[i] == nullptr) continue;
      const int n = (threadIdx.x >> 3) + 32 * i;
      moe_gemm::cp16<false>(stage + moe_gemm::swz(n, c), kin ? static_cast<const void*>(x[i] + k) : a.x, kin, pol_x);
    }
    if (xs) g8::cp4(scales + 4 * threadIdx.x, xs + ks, true);
  }
};

// p = the warpgroup's 64 weight rows of the stage . its 64 token rows, over the stage's 128 k: issued
// (committed as one group); p is the tensor core's until wgmma_done.
__device__ __forceinline__ void stage_wgmma(float (&p)[32], uint32_t wt, uint32_t xt) {
#pragma unroll
  for (int i = 0; i < 32; ++i) p[i] = 0.f;
  wgmma::fence_acc(p);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma::mma_m64n64k32_e4m3(p, wgmma::desc_sw128(wt + 32 * kk), wgmma::desc_sw128(xt + 32 * kk), kk);
  wgmma::commit();
}
__device__ __forceinline__ void wgmma_done(float (&p)[32]) {
  wgmma::fence_acc(p);
  wgmma::wait<0>();
  wgmma::fence_acc(p);
}

// The end of a (unit, pass): the accumulators, times the channel scales, to act (gate/up, SwiGLU,
// fp32) or out (down, fp32). Lane (w, g, q) of warpgroup wg holds rows 16 w + g (+ 8) of the
// warpgroup's 64 and token columns 8 j + 2 q + (i & 1) in acc[4 j + i].
template <bool kGateUp, int XR>
__device__ __forceinline__ void store_tile(const g8::Args& a, const float (&acc)[32], const moe_gemm::Unit& un,
                                           int pass, int wg) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, q = lane & 3;
  const float* se = a.s + int64_t(un.e) * (kGateUp ? 2 : 1) * a.R;
  int64_t f[2];
  float rs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    f[h] = kGateUp ? un.tile * 64 + 8 * (4 * wg + w) + g : un.tile * 128 + 64 * wg + 16 * w + g + 8 * h;
    rs[h] = 1.f;
    if (!a.block_scales && f[h] < a.R) rs[h] = __ldg(se + (kGateUp && h == 1 ? a.R : 0) + f[h]);
  }
  float* out = static_cast<float*>(a.out);
#pragma unroll
  for (int j = 0; j < XR / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int slot = pass * XR + 8 * j + 2 * q + c;
      if (slot >= un.n_e) continue;
      const int64_t row = un.begin + slot;
      const float sx = !a.block_scales ? __ldg(a.xs + row) : 1.f;
      if constexpr (kGateUp) {
        if (f[0] >= a.R) continue;
        const float gv = acc[4 * j + c] * rs[0] * sx, u = acc[4 * j + 2 + c] * rs[1] * sx;
        out[row * a.R + f[0]] = gv / (1.0f + expf(-gv)) * u;
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (f[h] < a.R) out[row * a.R + f[h]] = acc[4 * j + 2 * h + c] * rs[h] * sx;
      }
    }
}

// A stage's sums p into the accumulator: block128 (sxa: the stage's scales) times the weight block's
// scale and the token's, channel as they are (both scales at the store).
template <int XR>
__device__ __forceinline__ void add_stage(float (&acc)[32], const float (&p)[32], uint32_t sxa, bool blocks) {
  if (!blocks) {
#pragma unroll
    for (int i = 0; i < XR / 2; ++i) acc[i] += p[i];
    return;
  }
  const int q = threadIdx.x & 3;
  uint32_t scw[2];
  g8::lds64(scw, sxa + 4 * XR);
  const float sc[2] = {__uint_as_float(scw[0]), __uint_as_float(scw[1])};
#pragma unroll
  for (int j = 0; j < XR / 8; ++j) {
    uint32_t sxw[2];
    g8::lds64(sxw, sxa + 32 * j + 8 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[4 * j + i] = fmaf(sc[i >> 1] * __uint_as_float(sxw[i & 1]), p[4 * j + i], acc[4 * j + i]);
  }
}

// A block's dynamic shared memory: the stages from the first 1024-byte boundary (wgmma's swizzled
// tiles), their scales, then the offsets, the touched list, the count and UnitRing's ring.
template <class Sh>
struct BlockSmem {
  uint32_t base, scales;
  int *off, *touched, *count, *ring;
  __device__ __forceinline__ BlockSmem(unsigned char* smem, int n_experts) {
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem)), pad = (1024u - (raw & 1023u)) & 1023u;
    base = raw + pad;
    scales = base + Sh::kStages * Sh::kStage;
    off = reinterpret_cast<int*>(smem + pad + Sh::kStages * (Sh::kStage + Sh::kScales));
    touched = off + n_experts + 1;
    count = off + 2 * g8::kMaxExperts + 3;
    ring = off + 2 * g8::kMaxExperts + 4;
  }
};

// The F8 products (Args as moe_gemm_fp8_kernel's, out_mode kOutF32 for down, a.ctr required), BPS
// blocks an SM (the same units and arithmetic, so the same bits).
template <bool kGateUp, int XR, int BPS = 1>
__global__ void __launch_bounds__(kThreads, BPS) moe_wgmma_fp8_kernel(const g8::Args a) {
  using Sh = Shape<XR, BPS>;
  constexpr int S = Sh::kStages, kStage = Sh::kStage, kScales = Sh::kScales;
  extern __shared__ __align__(1024) unsigned char smem[];
  const BlockSmem<Sh> m(smem, a.n_experts);
  const int wg = threadIdx.x >> 7;

  if constexpr (kGateUp) moe_gemm::griddep_wait();
  moe_gemm::load_touched(a.offsets, a.n_experts, m.off, m.touched, *m.count);
  // gate/up lets act's quantization launch once it has the offsets; bench variant 16: at its end
  const bool late_launch = (a.variant & 16) != 0;
  if (kGateUp && !late_launch) moe_gemm::griddep_launch();

  const int64_t tiles = kGateUp ? (a.R + 63) / 64 : (a.R + 127) / 128;
  const int64_t units = int64_t(*m.count) * tiles;
  // units from the counter as blocks free up (g8::UnitRing, as moe_gemm_fp8_kernel's)
  g8::UnitRing ring(a.ctr, m.ring);
  int64_t pu = blockIdx.x;
  if (pu >= units) {
    if constexpr (!kGateUp) moe_gemm::griddep_wait();
    return;
  }
  const int nk = int((a.K + kBK - 1) / kBK);
  const bool blocks = a.block_scales != 0;

  Feeder<kGateUp, XR> feed;
  moe_gemm::l2_policies(a.l2_hints != 0, feed.pol_w, feed.pol_x);
  // where the producer and the consumer stand, both from the block's first unit
  moe_gemm::StageWalk pw{pu, g8::unit_of<XR>(pu, tiles, m.touched, m.off)}, cw = pw;
  feed.set_unit(a, pw.un);
  feed.set_pass(a, pw.un, 0);
  auto load = [&](int slot, int k, bool w, bool x) {
    if (w) feed.load_w(a, m.base + slot * kStage, m.scales + slot * kScales, k);
    if (x) feed.load_x(a, m.base + slot * kStage, m.scales + slot * kScales, k);
  };
  auto advance = [&]() {  // the producer one stage on
    if (++pw.k < nk) return;
    pw.k = 0;
    if (++pw.pass >= pw.un.passes) {
      pw.pass = 0;
      pw.u = ring.producer_next();
      if (pw.u >= units) return;
      pw.un = g8::unit_of<XR>(pw.u, tiles, m.touched, m.off);
      feed.set_unit(a, pw.un);
    }
    feed.set_pass(a, pw.un, pw.pass);
  };
  moe_gemm::fill_pipeline<kGateUp, S>(pw, units, nk, load, advance);

  int slot_c = 0, slot_p = S - 1;
  float acc[32] = {};
  while (cw.u < units) {
    moe_gemm::wait_pending<S - 2>();  // this thread's copies of stage slot_c have landed
    wgmma::fence_proxy_async();       // and are visible to the async proxy (wgmma's reads)
    __syncthreads();                  // everyone's are, and everyone's wgmma on slot_p has completed
    float p[32];
    stage_wgmma(p, m.base + slot_c * kStage + Sh::kTileX + wg * (64 * kBK), m.base + slot_c * kStage);
    // the refill of slot_p (consumed last round) while the tensor core works on slot_c
    slot_p = moe_gemm::refill_stage<S>(pw, units, slot_p, load, advance);
    wgmma_done(p);
    add_stage<XR>(acc, p, m.scales + slot_c * kScales, blocks);
    slot_c = slot_c + 1 == S ? 0 : slot_c + 1;
    if (++cw.k == nk) {
      store_tile<kGateUp, XR>(a, acc, cw.un, cw.pass, wg);
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] = 0.f;
      cw.k = 0;
      if (++cw.pass >= cw.un.passes) {
        cw.pass = 0;
        cw.u = ring.consumer_next();
        if (cw.u < units) cw.un = g8::unit_of<XR>(cw.u, tiles, m.touched, m.off);
      }
    }
  }
  moe_gemm::wait_pending<0>();
  if (!kGateUp || late_launch) moe_gemm::griddep_launch();
}

}  // namespace lfm2::cuda::moe_wgmma_fp8
