// Products with FP8 weights (docs/fp8.md), the CPU twins of kernels/cuda/fp8_ops.h: e4m3 matrices
// with fp32 scales per output row (channel) or per 128 x 128 block (block128), as the weight file
// holds them (common/fp8.h). The twins dequantize (w = e4m3 * scale in fp32) and run the fp32 ops:
// the weights-only oracle, or for the MoE the activation-quantized one.
#pragma once

#include <cstdint>

#include "common/fp8.h"

namespace lfm2::cpu {

// out (n_rows, n_out) = in (n_rows, n_in) W^T; w (n_out, n_in) e4m3, s its scales.
void linear_fp8(float* out, const float* in, const uint8_t* w, const float* s, Fp8Scheme scheme, int64_t n_rows,
                int64_t n_in, int64_t n_out, int n_threads = 1);

// linear_fp8 with its input quantized first as the FP8 x FP8 products quantize it (the twin of
// cuda::linear_fp8_lt, kernels/cuda/linear_fp8_lt.h): in's rows fake-quantized to e4m3 per row
// (channel) or per 128 columns (block128), fp8_fake_quantize_rows' rule.
void linear_fp8_act(float* out, const float* in, const uint8_t* w, const float* s, Fp8Scheme scheme, int64_t n_rows,
                    int64_t n_in, int64_t n_out, int n_threads = 1);

// moe_experts with e4m3 experts: w13 (n_experts, 2 inter, hidden) = each expert's w1 rows then w3
// rows, s13 their scales, each half with its own (channel: (n_experts, 2 inter); block128:
// (n_experts, 2 ceil(inter/128), ceil(hidden/128)), w1's blocks then w3's); w2 (n_experts, hidden,
// inter), s2 (n_experts, hidden) or (n_experts, ceil(hidden/128), ceil(inter/128)). out (n_tokens,
// hidden) = the experts' weighted sum (moe_experts' order). quantize_activations: each product's
// input rows (the gathered tokens, the SwiGLU output) fake-quantized to e4m3 per row (channel) or
// per 128 columns (block128), the CUDA stage's decode products (and the CPU stage's fp8_activations).
void moe_experts_fp8(float* out, const float* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                     const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights, int64_t n_tokens,
                     int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, int n_threads = 1,
                     bool quantize_activations = false);

}  // namespace lfm2::cpu
