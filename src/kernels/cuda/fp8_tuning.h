// Tuning knobs of the FP8 decode products, for cuda_bench_fp8 only (the production entries of
// kernels/cuda/fp8_ops.h run the defaults): each entry below is its fp8_ops.h twin with a
// Fp8DecodeTuning. Unless said, the knobs change speed only, never an output's bits.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/fp8_ops.h"

namespace lfm2::cuda {

struct Fp8DecodeTuning {
  // the MoE's products: 1 FP8 x FP8 (the tokens and act quantized to e4m3, the default), 0 the
  // e4m3 weights widened to T in registers against T activations (other bits: the weights-only
  // oracle's products)
  int act_fp8 = 1;
  // the widening of the e4m3 weights: 1 by bit placement (the default), 2 by the hardware e4m3 ->
  // fp16 conversion (the same values), 0 none: the raw bits into the mma (wrong results: what the
  // pipeline alone costs)
  int widen = 1;
  // the token tile's height as if the call had this many rows (8..64: more passes, fewer or more
  // weight stages in flight); 0: the call's rows
  int64_t tile_rows = 0;
  // bit 0: the products one token tile at a time (not in groups of 4); bit 1: no L2 eviction hints;
  // the MoE's kernels alone (wrong results, timing only): bit 2 without gate/up, bit 3 without
  // down, either without the combine; bit 4: FP8 x FP8 gate/up lets act's quantization launch at its
  // end (not once it has the offsets); bit 5: FP8 x FP8, each block a fixed share of the units (not
  // taken from a counter as blocks free up); bit 6: FP8 x FP8, one block an SM (not two up to
  // 32 token slots)
  int variant = 0;
  // the MoE's FP8 x FP8 products on wgmma (kernels/cuda/moe_decode_wgmma_fp8.cuh): -1 on compute
  // capability 9.0 (the default), 0 the mma.sync kernel (moe_decode_gemm_fp8.cuh); other bits than
  // mma.sync's (another summation order), each a row's own. Fixed shares (variant bit 5) run the
  // mma.sync kernel.
  int wgmma = -1;
  // the wgmma products' blocks an SM: 1 (the most stages), 2 (half the stages each; up to 32 token
  // slots, else 1), 0 by the device (LFM2_FP8_WGMMA_BLOCKS, else 2 where the DRAM passes 4.2 TB/s);
  // the same bits for either
  int wgmma_blocks = 0;
  // linear_fp8_decode's warps along k (2: 128-row units, 8: 32-row units); 0: by the shape
  int linear_kh = 0;
};

template <typename T>
void moe_experts_decode_fp8_tuned(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                                  const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights,
                                  int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                                  void* scratch, const Fp8DecodeTuning& tuning, cudaStream_t stream);
template <typename T>
void moe_experts_decode_fp8_routed_tuned(float* x, T* norm_out, const T* in, const uint8_t* w13, const float* s13,
                                         const uint8_t* w2, const float* s2, Fp8Scheme scheme, const int32_t* offsets,
                                         const int32_t* src_token, const int32_t* dest_row, const float* weights,
                                         const float* norm_weight, float eps, int64_t n_tokens, int64_t hidden,
                                         int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                                         const Fp8DecodeTuning& tuning, cudaStream_t stream);
template <typename T>
void linear_fp8_decode_tuned(void* out, Fp8Out out_kind, const T* in, const uint8_t* w, const float* s,
                             Fp8Scheme scheme, int64_t n_rows, int64_t n_in, int64_t n_out,
                             const Fp8DecodeTuning& tuning, cudaStream_t stream);

}  // namespace lfm2::cuda
