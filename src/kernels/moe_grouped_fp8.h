// The CPU twins of the FP8 grouped GEMM for prefill (kernels/cuda/grouped_gemm_fp8.h): e4m3
// activations with one scale per (row, 128 columns) in the grouped GEMM's layout, and the products
// of expert-ordered rows with e4m3 experts and 128 x 128 block scales, accumulated as the GPU does:
// per 128-deep k block the fp32 sum of the e4m3 products, then times both scales into the total.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// q (n_rows, cols) = e4m3(x / s), s = amax / 448 of each row's 128 columns (amax 0: 1); the scales
// of expert e's rows at scales + offsets[e] * (cols / 128), k-block major. cols a multiple of 128.
void moe_quantize_e4m3(uint8_t* q, float* scales, const float* x, const int32_t* offsets, int64_t n_rows,
                       int64_t n_experts, int64_t cols);

// out (rows, n_out) = deq(in) deq(W_e)^T for expert e's rows [offsets[e], offsets[e+1]); w (n_experts,
// n_out, n_in) e4m3, w_scales (n_experts, n_in / 128, n_out / 128). n_in, n_out multiples of 128.
void moe_grouped_matmul_fp8(float* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, const int32_t* offsets, int64_t n_experts, int64_t n_in,
                            int64_t n_out);

}  // namespace lfm2::cpu
