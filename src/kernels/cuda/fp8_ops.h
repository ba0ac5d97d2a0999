// The CUDA FP8 products (docs/fp8.md), twins of kernels/fp8_products.h: e4m3 weights and fp32
// scales as the weight file holds them, 16-bit activations (bf16 or fp16), fp32 accumulation
// (kernels/cuda/moe_decode_gemm_fp8.cuh). The MoE's products are FP8 x FP8: its tokens and act
// quantized to e4m3 per row (channel) or per (row, 128 columns) (block128), both scales applied to
// the fp32 sums (the activation-quantized oracle: cpu::moe_experts_fp8(..., quantize_activations)).
// The projections widen each weight exactly to T in registers, its scale on the fp32 sums (per row
// at the end, or per 128-k block). Hopper (sm_90); hidden and inter multiples of 16, buffers 16-byte
// aligned. Queue kernels only (capturable in a CUDA graph); a row's bits do not depend on the other
// rows or their number.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/fp8.h"

namespace lfm2::cuda {

// moe_experts_decode with e4m3 experts: x (n_tokens, hidden) fp32 += experts(in). w13 / s13 and
// w2 / s2 as cpu::moe_experts_fp8. Scratch: moe_experts_decode_fp8_scratch_bytes.
int64_t moe_experts_decode_fp8_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                             int64_t top_k, int64_t elem_bytes);
template <typename T>
void moe_experts_decode_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                            const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights,
                            int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                            void* scratch, cudaStream_t stream);

// The same from the router's permutation (moe_route_decode's offsets, src_token, dest_row: the
// decode MoE's stage permutes once), the combine fused with the next layer's norm as moe_decode's:
// x += experts(in), then, if norm_weight, norm_out = rmsnorm(x) (eps). Scratch:
// moe_experts_decode_fp8_routed_scratch_bytes (the e4m3 tokens, act and its e4m3, the expert rows'
// fp32 outputs).
int64_t moe_experts_decode_fp8_routed_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t inter, int64_t top_k,
                                                    int64_t elem_bytes);
template <typename T>
void moe_experts_decode_fp8_routed(float* x, T* norm_out, const T* in, const uint8_t* w13, const float* s13,
                                   const uint8_t* w2, const float* s2, Fp8Scheme scheme, const int32_t* offsets,
                                   const int32_t* src_token, const int32_t* dest_row, const float* weights,
                                   const float* norm_weight, float eps, int64_t n_tokens, int64_t hidden,
                                   int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                                   cudaStream_t stream);

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

}  // namespace lfm2::cuda
