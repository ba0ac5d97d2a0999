// The CPU twins of the FP8 grouped GEMM for prefill (kernels/cuda/grouped_gemm_fp8.h): e4m3
// activations with one scale per row or per (row, 128 columns) in the grouped GEMM's layouts (the
// gathered rows, or the SwiGLU of [gate | up] rows), and the products of expert-ordered rows with
// e4m3 experts under channel or 128 x 128 block scales, accumulated as the GPU does: per 128-deep k
// block the fp32 sum of the e4m3 products, then times both scales into the total.
#pragma once

#include <cstdint>

#include "common/fp8.h"

namespace lfm2::cpu {

// q (n_rows, cols) = e4m3(x[src] / s), src = src_row[r] (or r when null), s = amax / 448 of the row
// (per_row) or of each 128 columns of it (amax 0: 1). One scale per (row, 128 columns) (a row's one
// scale repeated under per_row), expert e's at scales + offsets[e] * (cols / 128), k-block major.
// Rows from offsets[n_experts] on are skipped; a row whose src is -1 (a padding row of moe_pad_rows)
// gets zero codes and scales 1. cols a multiple of 128.
void moe_quantize_e4m3(uint8_t* q, float* scales, const float* x, const int32_t* src_row, const int32_t* offsets,
                       int64_t n_rows, int64_t n_experts, int64_t cols, bool per_row);

// moe_permute's grouping (offsets, src_token, dest_row of n_pairs pairs) padded per expert: expert
// e's rows moved to poff[e] .. (poff[e] = the earlier experts' row counts each rounded up to 128),
// src_pad (m_pad) the padded rows' tokens (-1 for the padding and the rows past the last expert),
// dest_pad (n_pairs) each pair's padded row (-1 stays -1), tile_expert (m_pad / 128) each 128-row
// tile's expert (n_experts - 1 past the last expert's tiles), one_group = {0, m_pad} (the padded rows
// as one group, for moe_quantize_e4m3's scale layout), *used_rows = poff[n_experts] (the padded
// product skips the tiles past it). m_pad: moe_padded_rows(n_pairs, n_experts).
void moe_pad_rows(int32_t* src_pad, int32_t* dest_pad, int32_t* tile_expert, int32_t* one_group, int32_t* used_rows,
                  const int32_t* offsets, const int32_t* src_token, const int32_t* dest_row, int64_t n_pairs,
                  int64_t n_experts, int64_t m_pad);

// silu(g) * u of the [gate | up] rows of gate_up (n_rows, 2 inter) in fp32 (cpu::silu's formula),
// quantized as moe_quantize_e4m3 into q (n_rows, inter) but with codes e4m3(v * (448 / amax)) (one
// division a group; a group with amax < 2^-100 by v / s). The GPU's silu is the fast exponential
// and division (codes at most one apart). Rows r with pad_src[r] < 0 (pad_src null: none) are
// padding: zero codes, scales 1, gate_up not read.
void moe_swiglu_quantize_e4m3(uint8_t* q, float* scales, const float* gate_up, const int32_t* pad_src,
                              const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t inter, bool per_row);

// out (rows, n_out) = deq(in) deq(W_e)^T for expert e's rows [offsets[e], offsets[e+1]); in_scales
// as moe_quantize_e4m3 writes them; w (n_experts, n_out, n_in) with w_scales k-block major per
// expert: (n_experts, n_in / 128, n_out) (Channel: each row's scale repeated per k block) or
// (n_experts, n_in / 128, n_out / 128) (Block128). n_in, n_out multiples of 128.
void moe_grouped_matmul_fp8(float* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, Fp8Scheme w_scheme, const int32_t* offsets, int64_t n_experts,
                            int64_t n_in, int64_t n_out);

// The channel scheme's products without scales: out (rows, n_out) = the fp32 sum over k of
// e4m3(in[r][k]) e4m3(W_e[n][k]) for expert e's rows (the GPU writes it as bf16).
void moe_grouped_matmul_fp8_raw(float* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                                int64_t n_experts, int64_t n_in, int64_t n_out);

// moe_swiglu_quantize_e4m3 per row of gate/up's raw sums, each scaled first: g = raw_g * s_a *
// s_w[c], u = raw_u * s_a * s_w[inter + c] (fp32, left to right), s_a the row's scale in in_scales
// (moe_quantize_e4m3's layout over n_in columns), s_w = w13_scales + e * (n_in / 128) * 2 inter.
void moe_swiglu_quantize_e4m3_scaled(uint8_t* q, float* scales, const float* gate_up, const float* in_scales,
                                     const float* w13_scales, const int32_t* offsets, int64_t n_rows,
                                     int64_t n_experts, int64_t n_in, int64_t inter);

// x[t] += sum over token t's pairs in ascending row p (p < 0 skipped) of
// ((raw[p][c] * s_a(p)) * s_w(e, c)) * weight: s_a(p) = act_scales' row p (moe_quantize_e4m3's
// layout over inter columns), e row p's expert, s_w(e, c) = w2_scales[e * (inter / 128) * hidden + c].
void moe_combine_fp8_scaled(float* x, const float* expert_out, const int32_t* dest_row, const float* weights,
                            const float* act_scales, const float* w2_scales, const int32_t* offsets,
                            int64_t n_tokens, int64_t n_experts, int64_t top_k, int64_t hidden, int64_t inter);

}  // namespace lfm2::cpu
