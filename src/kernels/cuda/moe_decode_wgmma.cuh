// The wgmma consumer of the decode expert products (moe_decode_gemm.cuh's moe_gemm_kernel with
// Consumer = WgmmaConsumer; sm_90a only, instantiated in moe_decode_wgmma.cu): the same producer,
// units, passes and PDL, the stage multiplied by Hopper's warpgroup MMA instead of 8 warps of
// ldmatrix + mma.sync.
//
// A stage is already what wgmma reads: the 128 x 64 weight tile (A, M = weight rows) and the
// 64 x 64 token tile (B, N = token slots), K-major, 128-byte rows with the 128-byte swizzle, the
// stages 1024-byte aligned (kPad). Warpgroup wg multiplies weight rows [64 wg, +64) by all 64 slots:
// 4 x m64n64k16 a stage (k 0-15, ..., 48-63 in order), fp32 accumulators, N = 64 whatever the live
// tokens, so the instruction sequence never depends on the batch and an output element (feature,
// token) is still the sum over 64-k stages in ascending k of its weight row and token row alone.
// gate/up's tile holds, per 16-row slab, 8 gate rows and the up rows of the same 8 j (Feeder
// kPairs8): thread (warp w of wg, lane g q) holds gate j and up j of j = 64 tile + 8 (4 wg + w) + g.
//
// Ordering a stage: cp.async wait -> fence.proxy.async (the kernel) -> barrier -> wgmma.fence ->
// 4 mma -> commit -> wait<0>: the slot's reads are over before this thread reaches the next
// barrier, after which the producer refills that slot.
#pragma once

#include "kernels/cuda/moe_decode_gemm.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lfm2::cuda::moe_gemm {

template <typename T, bool kGateUp>
struct WgmmaConsumer {
  static constexpr bool kAsyncProxy = true;
  static constexpr bool kPairs8 = true;
  static constexpr int kPad = 1024;  // the 128-byte swizzle's atoms: 8 rows of 128 bytes
  float d[32];
  int wg;

  __device__ __forceinline__ WgmmaConsumer() : wg(threadIdx.x >> 7) {
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
  }
  __device__ __forceinline__ void begin(const Unit&, int) {}
  __device__ __forceinline__ void stage(uint32_t s) {
    const uint32_t wa = s + uint32_t(wg) * 64 * kRowBytes, xa = s + kTileW;
    wgmma::fence_acc(d);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma::mma_m64n64k16<T>(d, wgmma::desc_sw128(wa + 32 * kk), wgmma::desc_sw128(xa + 32 * kk), 1);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_acc(d);
  }
  // d to act (gate/up, SwiGLU) or y (down); zeroed. Register 4 n + i: slot 8 n + 2 q + (i & 1) of
  // tile row 16 w + g + 8 (i >> 1) of the warpgroup's 64.
  __device__ __forceinline__ void store(const Args& a, const Unit& un, int pass) { store_as<kGateUp>(a, un, pass); }
  // the same for either product (moe_decode_fused.cuh: one consumer for both)
  template <bool kGU>
  __device__ __forceinline__ void store_as(const Args& a, const Unit& un, int pass) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int slot = pass * kTB + 8 * n + 2 * q + i;
        if (slot >= un.n_e) continue;
        const int64_t row = un.begin + slot;
        if constexpr (kGU) {
          const int64_t j = un.tile * 64 + 8 * (4 * wg + w) + g;
          const float gt = d[4 * n + i];
          if (j < a.R) static_cast<T*>(a.out)[row * a.R + j] = from_f32<T>(gt / (1.0f + expf(-gt)) * d[4 * n + 2 + i]);
        } else {
#pragma unroll
          for (int h8 = 0; h8 < 2; ++h8) {
            const int64_t h = un.tile * kBM + 64 * wg + 16 * w + g + 8 * h8;
            if (h < a.R) static_cast<float*>(a.out)[row * a.R + h] = d[4 * n + 2 * h8 + i];
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
  }
};

}  // namespace lfm2::cuda::moe_gemm
