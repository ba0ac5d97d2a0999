// The CUDA FP8 products (docs/fp8.md), twins of kernels/fp8_products.h: e4m3 weights and fp32
// scales as the weight file holds them, 16-bit activations (bf16 or fp16), fp32 accumulation, each
// weight widened exactly to T in registers and its scale applied to the fp32 sums (per row at the
// end, or per 128-k block) (kernels/cuda/moe_decode_gemm_fp8.cuh). Hopper
// (sm_90); hidden and inter multiples of 16, buffers 16-byte aligned. Queue kernels only
// (capturable in a CUDA graph); a row's bits do not depend on the other rows or their number.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/fp8.h"

namespace lfm2::cuda {

// moe_experts_decode with e4m3 experts: x (n_tokens, hidden) fp32 += experts(in). w13 / s13 and
// w2 / s2 as cpu::moe_experts_fp8. Scratch: moe_experts_decode_scratch_bytes(..., sizeof(T)).
template <typename T>
void moe_experts_decode_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                            const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights,
                            int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                            void* scratch, cudaStream_t stream);

// out (n_rows, n_out) = in (n_rows, n_in) W^T with w (n_out, n_in) e4m3 and s its scales, at few
// rows (the decode projections): out as T, as fp32, or added into an fp32 out (the residual).
enum class Fp8Out { T, F32, AddF32 };
template <typename T>
void linear_fp8_decode(void* out, Fp8Out out_kind, const T* in, const uint8_t* w, const float* s, Fp8Scheme scheme,
                       int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream);

// fp8_dequantize (cpu::fp8_dequantize_mats, kernels/fp8_dequantize.h): n_mats e4m3 matrices (rows,
// cols) and their scales, back to back, into out as T(q * scale): the values the upload's host
// dequantization gives. The CUDA stage's prompt rows of an FP8 file's experts. Queue kernels only.
template <typename T>
void fp8_dequantize(T* out, const uint8_t* q, const float* scale, Fp8Scheme scheme, int64_t n_mats, int64_t rows,
                    int64_t cols, cudaStream_t stream);

// Tuning only (cuda_bench_fp8): skip the widening of the e4m3 weights, so the products run on the
// raw bits (wrong results): what the pipeline alone costs.
void fp8_decode_force_skip_widen(bool skip);
// Tuning only (cuda_bench_fp8): how the e4m3 weights are widened: 1 by bit placement (the default),
// 2 by the hardware e4m3 -> fp16 conversion (the same values), 0 not at all (as skip_widen).
void fp8_decode_force_widen(int mode);
// Tuning only (cuda_bench_fp8): linear_fp8_decode's warps along k (2: 128-row units, 8: 32-row
// units; 0: by the shape, the default).
void fp8_linear_force_split(int kh);
// Tuning only (cuda_bench_fp8): the token tile's height as if the call had `rows` rows (8..64:
// more passes, fewer or more weight stages in flight; the same bits); 0: the call's rows.
void fp8_decode_force_tile(int64_t rows);
// Tuning only (cuda_bench_fp8): bit 0 = the products one token tile at a time (not in groups of 4),
// bit 1 = no L2 eviction hints; the same bits. 0: the default.
void fp8_decode_force_variant(int v);

}  // namespace lfm2::cuda
