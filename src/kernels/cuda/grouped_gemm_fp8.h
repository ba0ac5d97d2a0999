// The FP8 grouped GEMM of the experts for prefill (issue 23; docs/fp8.md): e4m3 activations x e4m3
// weights with fp32 scales, fp32 accumulation, bf16 out, on CUTLASS's sm90 ptr-array kernel with
// blockwise scaling (KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum: each 128-deep
// k block's wgmma products are scaled by scale_a(row, k block) * scale_w(n, k block) and added into
// the fp32 accumulators), and the kernels that make its e4m3 inputs. Scales, as the CPU oracle's
// fp8_activations quantizes (cpu_layers.cpp): activations one per row (the channel scheme) or per
// (row, 128 columns) (block128, DeepSeek-V3's grouping); weights one per output row (channel) or
// per 128 x 128 block (block128). The CPU twins: kernels/moe_grouped_fp8.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "common/fp8.h"

namespace lfm2::cuda {

template <typename T>
struct NextNorm;  // ops.h

// The activation scales' layout for rows grouped by expert (offsets[e] .. offsets[e+1] - 1 are
// expert e's; rows from offsets[n_experts] on belong to none and get nothing): one per (row, 128
// columns), expert e's block at scales + offsets[e] * (cols / 128), k-block major ((cols / 128)
// runs of its M_e rows): CUTLASS's sm90 scales are MN-major, and its grouped kernel derives their
// layout from the problem shape, so a per-row scale is written once for every 128 columns.
// Floats: n_rows * cols / 128.
inline int64_t moe_e4m3_scale_count(int64_t n_rows, int64_t cols) { return n_rows * (cols / 128); }

// q (n_rows, cols) = e4m3(x[src] / s) rounded to nearest even, saturating, s = amax / 448 of the
// row (per_row) or of each 128 columns of it (amax 0: s = 1), fp8_quantize's rule; src = src_row[r]
// (the MoE's gather into expert order fused) or r when src_row is null; a src of -1 (moe_pad_rows'
// padding) gives zero codes and scales 1. cols a multiple of 128; 16-byte aligned rows. Never
// allocates.
template <typename T>
void moe_quantize_e4m3(uint8_t* q, float* scales, const T* x, const int32_t* src_row, const int32_t* offsets,
                       int64_t n_rows, int64_t n_experts, int64_t cols, bool per_row, cudaStream_t stream);

// moe_quantize_e4m3's output for tokens quantized before (rmsnorm_quantize_e4m3): row r of q gets
// token src_row[r]'s codes (q_in (n_tokens, cols)) and its scales (the one of 128 columns g at
// s_in[g * s_ld + token]) at moe_quantize_e4m3's places: a byte gather, the same bits (a src of -1:
// zero codes and scales 1, as there).
void moe_gather_e4m3(uint8_t* q, float* scales, const uint8_t* q_in, const float* s_in, int64_t s_ld,
                     const int32_t* src_row, const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t cols,
                     cudaStream_t stream);

// The SwiGLU of the [gate | up] rows of gate_up (n_rows, 2 inter), silu(g) * u in fp32 (cpu::silu's
// formula), quantized as moe_quantize_e4m3 into q (n_rows, inter): the down product's input. A row r
// with pad_src[r] < 0 (moe_pad_rows' padding; pad_src null: none) gets zero codes and scales 1
// without its gate_up being read (the padded product leaves the rows past the used ones unwritten).
void moe_swiglu_quantize_e4m3(uint8_t* q, float* scales, const __nv_bfloat16* gate_up, const int32_t* pad_src,
                              const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t inter, bool per_row,
                              cudaStream_t stream);

// out (rows, n_out) = deq(in) deq(W_e)^T for expert e's rows: in and in_scales from
// moe_quantize_e4m3, W (n_experts, n_out, n_in) e4m3 with w_scales under
// w_scheme, k-block major per expert (DeviceLayerWeights::experts_w13_st): Channel (n_experts,
// n_in / 128, n_out), each output row's scale repeated for every 128-deep k block; Block128
// (n_experts, n_in / 128, n_out / 128), the transpose of the file's 128 x 128 block scales
// (n_out / 128, n_in / 128). n_in, n_out multiples of 128;
// Hopper (sm_90a). workspace: moe_grouped_matmul_fp8_workspace_bytes. Queues two kernels (argument
// setup, the GEMM); never allocates or synchronises. A row's bits depend on that row alone.
int64_t moe_grouped_matmul_fp8_workspace_bytes(int64_t n_experts);
void moe_grouped_matmul_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, Fp8Scheme w_scheme, const int32_t* offsets, int64_t max_rows,
                            int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream);

// Rows padded per expert (the padded product's layout, moe_padded_gemm_fp8.cu): expert e's rows at
// poff[e] .. poff[e] + M_e - 1, poff[e] = the sum of the earlier experts' M rounded up to 128, then
// padding rows up to poff[e + 1]; tile t (rows 128 t .. 128 t + 127) belongs to tile_expert[t] (any
// expert for the tiles past the last). The activation scales: one per (row, 128 columns) at
// scales[g * m_pad + row] (moe_quantize_e4m3's layout for one group of m_pad rows). m_pad, the rows
// of every routing of n_rows: moe_padded_rows.
inline int64_t moe_padded_rows(int64_t n_rows, int64_t n_experts) {
  return (n_rows + n_experts * 127 + 127) / 128 * 128;
}

// cpu::moe_pad_rows (kernels/moe_grouped_fp8.h) on the device, one launch: moe_permute's grouping
// padded per expert (src_pad (m_pad) -1 for padding rows, dest_pad (n_pairs), tile_expert
// (m_pad / 128), one_group = {0, m_pad}, *used_rows = the rows up to the last expert's last tile).
// m_pad a multiple of 128, at least moe_padded_rows.
void moe_pad_rows(int32_t* src_pad, int32_t* dest_pad, int32_t* tile_expert, int32_t* one_group, int32_t* used_rows,
                  const int32_t* offsets, const int32_t* src_token, const int32_t* dest_row, int64_t n_pairs,
                  int64_t n_experts, int64_t m_pad, cudaStream_t stream);

// moe_grouped_matmul_fp8 (block128) over the padded rows: out (m_pad, n_out) = deq(in) deq(W_e)^T,
// e the row's tile's expert, in one GEMM with no per-expert descriptors (CUTLASS's grouped kernel
// updates its TMA descriptors whenever a CTA's next tile is another expert's). A row's bits are
// moe_grouped_matmul_fp8's for the same row (the same tile, k order and promotion); padding rows
// of zero codes give zeros. used_rows (device, a multiple of 128; null: m_pad): the rows from
// *used_rows on are neither read nor written (their tiles skipped). Workspace as
// moe_grouped_matmul_fp8's.
void moe_grouped_matmul_fp8_padded(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                                   const float* w_scales, const int32_t* tile_expert, const int32_t* used_rows,
                                   int64_t m_pad, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace,
                                   cudaStream_t stream);

// The gate/up product of moe_grouped_matmul_fp8_padded (w13 = [w1; w3] of each expert, (2 inter,
// n_in)) with the SwiGLU and its quantization in the GEMM's epilogue (moe_padded_swiglu_fp8.cu):
// q (m_pad, inter) e4m3 and scales (inter / 128, m_pad) as moe_swiglu_quantize_e4m3 writes them from
// that product's bf16 output (one group of m_pad rows), the same bits, without the bf16 [gate | up]
// in memory. The rows from *used_rows on are neither read nor written; padding rows before it (zero
// codes in) get zero codes and scales 1, as there. inter a multiple of 256 (a CTA pair's gate tiles),
// n_in of 128; workspace as moe_grouped_matmul_fp8's.
void moe_grouped_matmul_fp8_padded_swiglu(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales,
                                          const uint8_t* w13, const float* w13_scales, const int32_t* tile_expert,
                                          const int32_t* used_rows, int64_t m_pad, int64_t n_experts, int64_t n_in,
                                          int64_t inter, void* workspace, cudaStream_t stream);
inline bool moe_padded_swiglu_fits(int64_t inter) { return inter > 0 && inter % 256 == 0; }

// The channel scheme's products without scales (moe_grouped_gemm_fp8_plain.cu): out (rows, n_out) =
// the fp32 sum of in x W_e^T over the e4m3 codes, written as bf16, for expert e's rows; the row and
// output-row scales factor out of the sum and are applied by the consumers
// (moe_swiglu_quantize_e4m3_scaled, moe_combine_fp8_scaled). Shapes, alignment, workspace and
// queueing as moe_grouped_matmul_fp8.
void moe_grouped_matmul_fp8_raw(__nv_bfloat16* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                                int64_t max_rows, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace,
                                cudaStream_t stream);

// moe_swiglu_quantize_e4m3 per row on gate/up's raw sums (moe_grouped_matmul_fp8_raw of w13 on
// rows quantized per row): g = raw_g * s_a * s_w[c], u = raw_u * s_a * s_w[inter + c] in fp32 (left
// to right), s_a the row's scale in in_scales (moe_quantize_e4m3's layout over n_in columns),
// s_w = w13_scales + e * (n_in / 128) * 2 inter (k block 0 of the channel scales, (E, n_in / 128,
// 2 inter)); then silu(g) * u quantized per row into q and scales (moe_quantize_e4m3's layout).
void moe_swiglu_quantize_e4m3_scaled(uint8_t* q, float* scales, const __nv_bfloat16* gate_up, const float* in_scales,
                                     const float* w13_scales, const int32_t* offsets, int64_t n_rows,
                                     int64_t n_experts, int64_t n_in, int64_t inter, cudaStream_t stream);

// moe_combine of down's raw sums: x[t] += sum over token t's pairs, ascending row p (dropped pairs,
// p < 0, skipped), of (raw[p][c] * s_a(p) * s_w(e, c)) * weight, s_a(p) down's input scale of row p
// (act_scales, moe_quantize_e4m3's layout over inter columns), e the expert of row p (by the
// offsets), s_w(e, c) = w2_scales[e * (inter / 128) * hidden + c] (k block 0). One block per token,
// no atomics; hidden % 8 == 0, 16-byte aligned rows.
void moe_combine_fp8_scaled(float* x, const __nv_bfloat16* expert_out, const int32_t* dest_row, const float* weights,
                            const float* act_scales, const float* w2_scales, const int32_t* offsets,
                            int64_t n_tokens, int64_t n_experts, int64_t top_k, int64_t hidden, int64_t inter,
                            cudaStream_t stream);

// The routed experts of prompt rows on the FP8 tensor cores, moe_experts with e4m3 experts: x
// (n_tokens, hidden) fp32 += experts(in). The permutation by expert; the gather into expert order
// quantized to e4m3 (moe_quantize_e4m3); gate/up (moe_grouped_matmul_fp8, bf16 out); the SwiGLU
// quantized (moe_swiglu_quantize_e4m3); down; moe_combine. Under Block128 the rows are padded per
// expert first (moe_pad_rows) and the products are moe_grouped_matmul_fp8_padded's (unless
// grouped::set_fp8_block_padded(false)), gate/up with the SwiGLU in its epilogue where inter % 256 == 0
// (moe_grouped_matmul_fp8_padded_swiglu; unless grouped::set_fp8_swiglu_fused(false)), the same bits
// every way. Under Channel (unless
// grouped::set_fp8_channel_plain(false)) the products are moe_grouped_matmul_fp8_raw's and the
// scales go to moe_swiglu_quantize_e4m3_scaled and moe_combine_fp8_scaled. Activations per row under Channel, per
// (row, 128 columns) under Block128 (the CPU oracle's fp8_activations). w13 (E, 2 inter, hidden)
// e4m3 (each expert's w1 rows then its w3 rows), w2 (E, hidden, inter); s13 / s2 as
// moe_grouped_matmul_fp8's w_scales. hidden and inter multiples of 128, Hopper. Scratch:
// moe_experts_fp8_scratch_bytes. Queues kernels only (capturable); a row's bits depend on it alone.
// in_q: in already quantized (rmsnorm_quantize_e4m3: codes (n_tokens, hidden), scales at
// in_s[g * in_s_ld + token]); the gather then copies them (moe_gather_e4m3), the same bits. next:
// the next layer's operator norm of the updated rows (ops.h), in the combine's launch (block128) or
// right after it (channel's scaled combine).
int64_t moe_experts_fp8_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                      int64_t top_k);
template <typename T>
void moe_experts_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2, const float* s2,
                     Fp8Scheme scheme, const int32_t* experts, const float* weights, int64_t n_tokens, int64_t hidden,
                     int64_t n_experts, int64_t inter, int64_t top_k, void* scratch, cudaStream_t stream,
                     const uint8_t* in_q = nullptr, const float* in_s = nullptr, int64_t in_s_ld = 0,
                     const NextNorm<T>* next = nullptr);

}  // namespace lfm2::cuda

// The CUTLASS side (moe_grouped_gemm_fp8.cu, compiled for sm_90a only; no CUTLASS in this header):
// the argument arrays + CUTLASS's workspace, and the kernel on arguments already checked.
namespace lfm2::cuda::grouped {
size_t fp8_workspace_bytes(int64_t n_experts, int sm_count);
void run_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
             const float* w_scales, bool w_per_channel, const int32_t* offsets, int64_t n_experts, int64_t n_in,
             int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream);

// The blockwise kernel's block128 configurations (the bench's, moe_grouped_gemm_fp8.cu): the
// launcher uses kFp8BlockDefault unless force_fp8_block_config() names one (-1: the default), and
// the tile scheduler's raster order (along M unless along_n) and swizzle (1, 2, 4 or 8) that
// set_fp8_block_schedule() sets. Each gives the same bits: a tile's sums do not depend on them.
inline constexpr int kFp8BlockConfigCount = 4;
inline constexpr int kFp8BlockDefault = 0;  // cooperative 128 x 128 x 128, cluster 1 x 2
const char* fp8_block_config_name(int config);
void force_fp8_block_config(int config);
void set_fp8_block_schedule(bool along_n, int swizzle);

// The plain kernel's tile configurations (moe_grouped_gemm_fp8_plain.cu): the launcher uses
// kFp8PlainDefault unless force_fp8_plain_config() names one (-1: the default again; the bench).
inline constexpr int kFp8PlainConfigCount = 4;
inline constexpr int kFp8PlainDefault = 1;  // cooperative 128 x 128 x 256, cluster 1 x 2
const char* fp8_plain_config_name(int config);
void force_fp8_plain_config(int config);
size_t fp8_plain_workspace_bytes(int64_t n_experts, int sm_count);
void run_fp8_plain(__nv_bfloat16* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                   int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device,
                   cudaStream_t stream);
// The block128 product over rows padded per expert (moe_padded_gemm_fp8.cu): one GEMM of m_pad
// rows, tile t's rows (128 t .. 128 t + 127) all of expert tile_expert[t]; in_scales (n_in / 128,
// m_pad) row-major (one per (row, 128 columns), row fastest); w and w_scales as run_fp8's; the
// tiles from *used_rows / 128 on skipped (used_rows null: none).
size_t fp8_padded_workspace_bytes(int64_t m_pad, int64_t n_out, int64_t n_in, int sm_count);
// The same product for gate/up with the SwiGLU's quantization in the epilogue
// (moe_padded_swiglu_fp8.cu): q and scales as moe_grouped_matmul_fp8_padded_swiglu's.
size_t fp8_padded_swiglu_workspace_bytes(int64_t m_pad, int64_t inter, int64_t n_in, int sm_count);
void run_fp8_padded_swiglu(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales, const uint8_t* w13,
                           const float* w13_scales, const int32_t* tile_expert, const int32_t* used_rows,
                           int64_t m_pad, int64_t n_experts, int64_t n_in, int64_t inter, void* workspace,
                           int sm_count, int device, cudaStream_t stream);
void run_fp8_padded(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                    const float* w_scales, const int32_t* tile_expert, const int32_t* used_rows, int64_t m_pad,
                    int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device,
                    cudaStream_t stream);
// Whether moe_experts_fp8 runs the channel scheme on the plain kernel (default) or on the
// blockwise one with repeated scales (false; the bench's comparison).
void set_fp8_channel_plain(bool on);
bool fp8_channel_plain();
// Whether moe_experts_fp8 runs block128 on rows padded per expert (moe_grouped_matmul_fp8_padded,
// default) or on the grouped kernel (false; the bench's comparison). The same bits either way.
void set_fp8_block_padded(bool on);
bool fp8_block_padded();
// Whether the padded path fuses the SwiGLU into gate/up's epilogue (moe_grouped_matmul_fp8_padded_swiglu,
// default where the shape allows) or runs the plain product and moe_swiglu_quantize_e4m3 (false; the
// bench's comparison). The same bits either way.
void set_fp8_swiglu_fused(bool on);
bool fp8_swiglu_fused();
// Whether both padded products draw their units from a counter (default: the SMs that finish early
// take the next unit) or walk CUTLASS's static stride (false, or LFM2_FP8_PADDED_SCHED=static, which
// sets the start). The same bits either way.
void set_fp8_padded_dynamic(bool on);
bool fp8_padded_dynamic();
// LFM2_FP8_PADDED_SCHED read now (unset or empty: dynamic); any value but dynamic or static throws
// lfm2::Error naming the variable. The setting above starts from it.
bool fp8_padded_dynamic_from_env();
}  // namespace lfm2::cuda::grouped
