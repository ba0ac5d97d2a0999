// The CUDA launchers of every operator, one declaration each. Each mirrors its CPU twin in
// src/kernels/<op>.h (same name, same argument order, in lfm2::cuda instead of lfm2::cpu) with the
// thread count replaced by a trailing cudaStream_t; fused ops name the CPU ops they compose.
//
// Element types: T is float, __nv_bfloat16 or __half for weights and activations; the residual
// stream, norm weights, router scores and softmax are always fp32. All pointers are device
// pointers unless said otherwise. Launchers never allocate and check the launch
// (CUDA_CHECK_LAUNCH, common/cuda_check.h); implementations are in src/kernels/<op>.cu.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kernels/paged_kv.h"

namespace lfm2::cuda {

// --- embedding.cu: out (n_tokens, hidden) fp32 = table[ids]; table (vocab, hidden). An id outside
// [0, vocab) (the caller range-checks on the host) gives a row of NaN.
template <typename T>
void embedding(float* out, const int32_t* ids, const T* table, int64_t n_tokens, int64_t vocab, int64_t hidden,
               cudaStream_t stream);

// --- rmsnorm.cu: out (n_rows, dim) = weight * (in * rsqrt(mean(in^2) + eps)), in fp32.
template <typename T>
void rmsnorm(T* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             cudaStream_t stream);
// Fused residual add + RMSNorm (cpu::add then cpu::rmsnorm): x += delta; out = rmsnorm(x).
// x (n_rows, dim) fp32, updated in place; delta (n_rows, dim).
template <typename T>
void add_rmsnorm(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 cudaStream_t stream);
// RMSNorm of the prompt rows that feed an e4m3 product (issue 23): out as rmsnorm, and rows
// [first_q, n_rows) also quantized to e4m3 from their T outputs, the codes and scales
// moe_quantize_e4m3 writes for out's rows afterwards (one group of n_rows - first_q rows): q
// (n_rows - first_q, dim), the scale of (row r, 128 columns g) at scales[g * (n_rows - first_q) +
// r - first_q], per row (its one scale repeated per group) or per (row, 128 columns). One pass over
// in; dim a multiple of 128 and <= 8192, in and weight 16-byte aligned. bf16 and fp16. prompt_out
// false: out's rows from first_q on are not written (their one consumer reads q; 2 of the 7 bytes a
// value this kernel moves).
template <typename T>
void rmsnorm_quantize_e4m3(T* out, uint8_t* q, float* scales, const float* in, const float* weight, int64_t n_rows,
                           int64_t first_q, int64_t dim, float eps, bool per_row, cudaStream_t stream,
                           bool prompt_out = true);
// RMSNorm of the last token of each sequence only: out (n_seq, dim); in (n_seq * seq_len, dim);
// lengths (n_seq, device) gives each sequence's own length (its last row is lengths[s] - 1), or null
// for seq_len.
template <typename T>
void rmsnorm_last(T* out, const float* in, const float* weight, int64_t n_seq, int64_t seq_len, int64_t dim,
                  float eps, cudaStream_t stream, const int32_t* lengths = nullptr);

// --- add.cu: out = a + b (n); out may equal a. The residual add when no norm follows.
template <typename T>
void add(float* out, const float* a, const T* b, int64_t n, cudaStream_t stream);

// --- linear.cu: out (n_rows, n_out) = in (n_rows, n_in) W^T, W (n_out, n_in), through cuBLASLt with
// fp32 accumulation: fp32 exact unless tf32; bf16/fp16 on tensor cores. linear_f32out writes fp32
// (router logits, LM head); linear_add_f32 adds the product into x (n_rows, n_out) fp32 (the residual
// add fused into the GEMM: x = x + in W^T). Buffers 16-byte aligned. The algorithm is pinned per
// (types, n_in, n_out) and reused for every n_rows, without split-K, so a row's bits do not depend
// on n_rows; set_gemm_pinning(false) (or LFM2_GEMM_PIN=0) lets cuBLASLt choose per n_rows instead.
template <typename T>
void linear(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream,
            bool tf32 = false);
template <typename T>
void linear_f32out(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32 = false);
template <typename T>
void linear_add_f32(float* x, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                    cudaStream_t stream, bool tf32 = false);
void set_gemm_pinning(bool pinned);
bool gemm_pinning();

// --- linear_decode.cu: the same three products for decode rows (any count; measured at 8-256), by
// one path per shape fixed by (n_in, n_out) alone (decode_gemm_path, a table measured on the H100):
// cuBLASLt with the algorithm its heuristic picks at plan_rows rows, pinned for every row count,
// or a swap-AB tensor-core kernel with a split-K fixed by the shape (decode_gemm_plan) and reduced
// in a fixed order. A row's bits depend on the shape only, never on n_rows or the other rows (they
// may differ from `linear`'s).
// bf16/fp16: n_in % 8 == 0, in and weight 16-byte aligned; fp32 runs `linear` (tf32 as there).
// Scratch: the device's decode workspace and cuBLAS workspace (cublas_ctx.h), so calls on one
// device are stream-ordered.
template <typename T>
void linear_decode(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32 = false);
template <typename T>
void linear_f32out_decode(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                          cudaStream_t stream, bool tf32 = false);
template <typename T>
void linear_add_f32_decode(float* x, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                           cudaStream_t stream, bool tf32 = false);
struct DecodeGemmPlan {
  int splits = 1;       // k slices, reduced in ascending order
  int64_t k_slice = 0;  // k per slice, a multiple of 64
};
DecodeGemmPlan decode_gemm_plan(int64_t n_in, int64_t n_out);
struct DecodeGemmPath {
  enum Kind { kKernel, kLt } kind = kLt;
  int64_t plan_rows = 128;  // kLt: the row count cuBLASLt's algorithm is picked at (4096: linear's)
};
DecodeGemmPath decode_gemm_path(int64_t n_in, int64_t n_out);
// Tuning and tests only: every later decode product takes *path (nullptr: the table's again).
void decode_gemm_force_path(const DecodeGemmPath* path);
// Tuning only (cuda_bench_decode): every later plan uses `splits` slices (0: the shape's own).
// Changes the bits of every decode product: never in a run.
void decode_gemm_force_splits(int splits);

// --- rope.cu: fused per-head q/k RMSNorm + RoPE (cpu::rmsnorm per head, then cpu::rope with
// position = row % seq_len), in place on qkv (n_seq * seq_len, (n_heads + 2 * n_kv_heads) * head_dim)
// whose rows are [q | k | v]; v is untouched. inv_freq (head_dim / 2) from cpu::rope_inv_freq.
// Angles, cos and sin in double rounded to fp32, as the CPU does.
template <typename T>
void qk_norm_rope(T* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, int64_t n_seq,
                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                  cudaStream_t stream);

// --- attention.cu: causal GQA attention, one fused kernel with an online softmax in fp32 (memory
// O(seq_len), any seq_len). out (n_tokens, n_heads * head_dim); q rows of q_stride elements
// (heads at h * head_dim), k and v rows of kv_stride elements (0: dense, as cpu::attention).
// head_dim one of 16, 32, 64, 128.
template <typename T>
void attention(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, cudaStream_t stream, int64_t q_stride = 0,
               int64_t kv_stride = 0);

// --- short_conv.cu: the short-conv mixer (cpu::short_conv). out (n_tokens, hidden);
// bcx (n_tokens, 3 * hidden); conv_w (hidden, L) fp32.
template <typename T>
void short_conv(T* out, const T* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden, int64_t L,
                cudaStream_t stream);
// short_conv_quantize_e4m3 (short_conv_fp8.cu): short_conv's rows quantized per (row, 128 columns)
// for the e4m3 out projection, the codes and scales quantize_rows_fp8_lt writes for short_conv's T
// rows (block128; linear_fp8_quantized's input): q (n_seq * seq_len, hidden), the scale of (row r,
// group g) at scales[g * n_seq * seq_len + r]. The T rows are not written. L = 3 (LFM2's), hidden a
// multiple of 128, bcx and q 16-byte aligned; bf16 and fp16.
template <typename T>
void short_conv_quantize_e4m3(uint8_t* q, float* scales, const T* bcx, const float* conv_w, int64_t n_seq,
                              int64_t seq_len, int64_t hidden, int64_t L, cudaStream_t stream);
// short_conv_step (cpu::short_conv_step): the rows of a generation step, each sequence (seqs: device,
// ordered by row, table_row = its slot) continuing from its slot's conv state (n_slots, L-1, hidden)
// fp32, which then holds the inputs before first_pos + ends[s] (ends: device, or null for n_rows).
// n_rows (the step's rows) and max_seq_rows (its longest entry) are the host's grid: a step of
// single rows (decode) runs one kernel that convolves and shifts, others two (the rows, then the
// states); both give every row the same bits. Slots distinct; L <= 16.
template <typename T>
void short_conv_step(T* out, const T* bcx, const float* conv_w, float* state, const PagedSeq* seqs, int64_t n_seqs,
                     const int32_t* ends, int64_t n_rows, int64_t max_seq_rows, int64_t hidden, int64_t L,
                     cudaStream_t stream);

// --- swiglu.cu: out (n_rows, inter) = silu(gate) * up where gate_up rows are [gate (inter) | up (inter)]
// (cpu::swiglu on each row's two halves: the layout of one GEMM over stacked [w1; w3]).
template <typename T>
void swiglu(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream);
// swiglu_pairs: the same over rows of interleaved pairs [g_0, u_0, g_1, u_1, ...] (the layout of one
// GEMM over an expert's interleaved w13, see moe_grouped_swiglu).
template <typename T>
void swiglu_pairs(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream);

// --- moe_router.cu: cpu::moe_router on the GPU. weights, experts (n_tokens, top_k); logits
// (n_tokens, n_experts) fp32; expert_bias (n_experts) or null. Ties: the lower expert index.
// n_experts <= 1024, top_k <= 32.
void moe_router(float* weights, int32_t* experts, const float* logits, const float* expert_bias, int64_t n_tokens,
                int64_t n_experts, int64_t top_k, bool norm_topk_prob, float routed_scaling_factor,
                cudaStream_t stream);
// moe_drop_rows (cpu::moe_drop_rows): the pairs of rows flagged in done (n_tokens) get expert -1.
void moe_drop_rows(int32_t* experts, const float* done, int64_t n_tokens, int64_t top_k, cudaStream_t stream);
// moe_router_drop: moe_router then moe_drop_rows (done (n_tokens) or null) in one launch (decode).
void moe_router_drop(float* weights, int32_t* experts, const float* logits, const float* expert_bias,
                     const float* done, int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob,
                     float routed_scaling_factor, cudaStream_t stream);
// moe_route_decode (decode rows, bf16/fp16): the router's logits (fp32 dot products of in (n_tokens,
// hidden) with gate (n_experts, hidden), a fixed order per row), moe_router_drop's top-k and
// moe_permute_one_block's outputs (offsets, src_token, dest_row) in one launch: its last block to
// finish permutes. A row's logits, weights and experts do not depend on the other rows. hidden % 8
// == 0, 16-byte aligned in / gate, n_experts <= 256. Uses a counter of the decode workspace
// (cublas_ctx.h): calls on one device are stream-ordered.
template <typename T>
void moe_route_decode(float* weights, int32_t* experts, int32_t* offsets, int32_t* src_token, int32_t* dest_row,
                      const T* in, const T* gate, const float* expert_bias, const float* done, int64_t n_tokens,
                      int64_t hidden, int64_t n_experts, int64_t top_k, bool norm_topk_prob,
                      float routed_scaling_factor, cudaStream_t stream);

// --- moe_permute.cu: the (token, slot) pairs sorted by expert, stably (token order within an expert),
// on the device: offsets (n_experts + 1), the first permuted row of each expert's group;
// src_token (n_tokens * top_k), the token each permuted row comes from; dest_row (n_tokens * top_k),
// the permuted row of (token, slot). scratch: moe_permute_scratch_ints() ints. n_experts <= 1024.
// A pair of expert -1 (moe_drop_rows) gets no row (dest_row -1); the rows past the last group's
// end get src_token 0, so a gather of all n_tokens * top_k rows stays inside `in`.
int64_t moe_permute_scratch_ints(int64_t n_tokens, int64_t n_experts, int64_t top_k);
void moe_permute(int32_t* offsets, int32_t* src_token, int32_t* dest_row, const int32_t* experts, int64_t n_tokens,
                 int64_t n_experts, int64_t top_k, int32_t* scratch, cudaStream_t stream);
// moe_permute_one_block: the same outputs from one block of one launch, no scratch (decode sizes;
// any size works, a few thousand pairs are quick).
void moe_permute_one_block(int32_t* offsets, int32_t* src_token, int32_t* dest_row, const int32_t* experts,
                           int64_t n_tokens, int64_t n_experts, int64_t top_k, cudaStream_t stream);

// --- moe_grouped_matmul.cu: the rows of each expert in order, then one GEMM per expert.
// moe_gather: out[r] = in[src_token[r]] for r < n_rows; out (n_rows, hidden), in (n_tokens, hidden).
template <typename T>
void moe_gather(T* out, const T* in, const int32_t* src_token, int64_t n_rows, int64_t hidden, cudaStream_t stream);
// moe_grouped_matmul: for each expert e and each row r in [offsets[e], offsets[e+1]):
// out[r] = in[r] W_e^T; out (max_rows, n_out), in (max_rows, n_in), W (n_experts, n_out, n_in).
// The row counts stay on the device (the host passes only the total). bf16/fp16: CUTLASS's sm90
// grouped GEMM (Hopper only; n_in, n_out multiples of 8, 16-byte aligned pointers); fp32: an exact
// SIMT kernel (any shape). workspace: moe_grouped_matmul_workspace_bytes(n_experts) bytes, 16-byte
// aligned, for the current device (unused by fp32). No split-K: a row's bits do not depend on
// max_rows or on the other rows.
int64_t moe_grouped_matmul_workspace_bytes(int64_t n_experts);
template <typename T>
void moe_grouped_matmul(T* out, const T* in, const T* weight, const int32_t* offsets, int64_t max_rows,
                        int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream);
// moe_grouped_swiglu (bf16/fp16 only): the gate/up product with SwiGLU in its epilogue (measured
// slower than moe_grouped_matmul + swiglu_pairs from 4096 tokens on; kept as an op, not used by
// moe_experts),
// act[r] (inter) = silu(g) * u where (g_j, u_j) = columns (2j, 2j + 1) of in[r] W13_e^T; w13
// (n_experts, 2 inter, n_in) with each expert's w1 and w3 rows interleaved (row 2j = w1 row j,
// 2j + 1 = w3 row j). Same requirements and workspace as moe_grouped_matmul; inter % 8 == 0.
template <typename T>
void moe_grouped_swiglu(T* act, const T* in, const T* w13, const int32_t* offsets, int64_t max_rows,
                        int64_t n_experts, int64_t n_in, int64_t inter, void* workspace, cudaStream_t stream);

// --- moe_combine.cu: weighted un-permutation fused with the residual add:
// x[t] += sum over t's experts in ascending order of weights[t, k] * expert_out[dest_row[t, k]]
// (fp32, fixed order, no atomics; a dest_row of -1, a dropped pair, adds nothing). top_k <= 32.
template <typename T>
void moe_combine(float* x, const T* expert_out, const int32_t* dest_row, const float* weights, int64_t n_tokens,
                 int64_t top_k, int64_t hidden, cudaStream_t stream);

// The next layer's operator norm of the rows a combine updates, made in the combine's launch
// (moe_combine_norm; moe_experts and moe_experts_fp8 take one): out (n_tokens, hidden) = rmsnorm(x)
// with weight and eps (out null: not written), and with q those T rows' e4m3 codes as
// rmsnorm_quantize_e4m3 makes them with first_q 0: q (n_tokens, hidden), the scale of (row r, 128
// columns g) at scales[g * n_tokens + r], per row or per (row, 128 columns). The bits of the
// separate launches.
template <typename T>
struct NextNorm {
  const float* weight;
  float eps;
  T* out;
  uint8_t* q = nullptr;
  float* scales = nullptr;
  bool per_row = false;
};
// moe_combine's sums, then next, in one launch: a block a token, its threads holding the norm's
// chunks (H100, 8,192 tokens x top-4 at 2,048 wide, FP8 block128 with the e4m3 codes: 103 us against
// 105 + 53 for the two launches).
// hidden % 4 == 0 and <= 8192 (% 128 with q); x, next.weight 16-byte aligned, expert_out and
// next.out 8-byte. Expert rows E: T, or bf16 under fp16 (the FP8 experts' bf16 outputs).
template <typename T, typename E>
void moe_combine_norm(float* x, const E* expert_out, const int32_t* dest_row, const float* weights, int64_t n_tokens,
                      int64_t top_k, int64_t hidden, const NextNorm<T>& next, cudaStream_t stream);
// Whether moe_combine_norm takes rows of this width.
bool moe_combine_norm_fits(int64_t hidden);

// moe_combine_rmsnorm (decode): moe_combine of fp32 expert rows into x, then, when norm_weight is
// not null, out (n_tokens, hidden) = rmsnorm(x) with norm_weight (the next layer's first norm
// fused: the bits of moe_combine then rmsnorm). hidden % 4 == 0 and <= 8192, x and expert_out 16-byte
// aligned. Launched as a programmatic dependent of the kernel before it.
template <typename T>
void moe_combine_rmsnorm(T* out, float* x, const float* expert_out, const int32_t* dest_row, const float* weights,
                         const float* norm_weight, int64_t n_tokens, int64_t top_k, int64_t hidden, float eps,
                         cudaStream_t stream);

// --- moe_experts.cu: cpu::moe_experts followed by cpu::add into the residual, composed from the
// kernels above: x (n_tokens, hidden) fp32 += experts(in). in (n_tokens, hidden);
// w13 (n_experts, 2 * inter, hidden), each expert's w1 rows then its w3 rows; w2 (n_experts, hidden,
// inter); experts, weights (n_tokens, top_k) from moe_router(); scratch of
// moe_experts_scratch_bytes() (for the current device). bf16/fp16: hidden and inter multiples of 8
// (Hopper only). Queues kernels only: capturable in a CUDA graph. next: its combine is
// moe_combine_norm's (the next layer's operator norm of the updated rows made in the same launch).
int64_t moe_experts_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                                  int64_t elem_bytes);
template <typename T>
void moe_experts(float* x, const T* in, const T* w13, const T* w2, const int32_t* experts, const float* weights,
                 int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                 cudaStream_t stream, const NextNorm<T>* next = nullptr);

// --- moe_experts_decode.cu: moe_experts for decode rows (same arguments and result up to rounding),
// reading each touched expert's weights once near the memory bandwidth: a one-block permutation,
// persistent pipelined gate/up (SwiGLU in registers) and down (fp32) products over the touched
// experts, moe_combine_rmsnorm. A row's bits do not depend on n_tokens, the other rows or their
// routing (they differ from moe_experts'). Scratch: moe_experts_decode_scratch_bytes(). bf16/fp16:
// hidden, inter multiples of 8, n_experts <= 1024, buffers 16-byte aligned; fp32 runs moe_experts.
// Queues kernels only: capturable in a CUDA graph.
int64_t moe_experts_decode_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                         int64_t top_k, int64_t elem_bytes);
template <typename T>
void moe_experts_decode(float* x, const T* in, const T* w13, const T* w2, const int32_t* experts, const float* weights,
                        int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                        void* scratch, cudaStream_t stream);
// Tuning only (cuda_bench_decode; LFM2_MOE_VARIANT for a run): the products' variant (0: the
// default, 11 on compute capability 9.0, else 2 or 4 by the batch; 1: the first decode kernels,
// other bits; 2-6 pipelined, the same bits: 6 stages, 8 stages, 4 stages at two blocks per SM, each
// with L2 hints, then 6 stages and 4 stages at two blocks per SM without; 7, 8: 2 and 4 with (unit,
// pass) items for the blocks; 9, 10: 2 and 4 on wgmma, bits of their own, on compute capability 9.0
// only (elsewhere they run 2); 11, 12: 9 and 9 with items, the units taken from a counter as blocks
// free up, 9's bits (elsewhere on mma.sync, 2's bits)) and, for variant 1, 8 nt tokens per pass (0:
// by the mean rows; speed only).
void moe_experts_decode_force_variant(int variant);
// Tuning and tests only: the bytes of each weight row of gate/up's likely first unit fetched into L2
// during the router (timing only, never the bits; -1: LFM2_MOE_SPEC_BYTES, else 2048; 0: none).
void moe_experts_decode_force_spec_bytes(int bytes);
void moe_experts_decode_force_nt(int nt);

// moe_decode: the routed MoE block of decode rows (HF Lfm2MoeSparseMoeBlock) in four launches:
// moe_route_decode (rows flagged in done, or none, get nothing), the products above, and
// moe_combine_rmsnorm: x (n_tokens, hidden) fp32 += experts(in); then, if next_norm is not null,
// norm_out = rmsnorm(x) with next_norm and eps (the next layer's operator norm). gate (n_experts,
// hidden), expert_bias (n_experts) or null, w13 / w2 as moe_experts. Scratch: moe_decode_scratch_bytes().
// fp32 composes linear_f32out, moe_router_drop, moe_experts and rmsnorm. Capturable in a CUDA graph.
struct MoeDims {
  int64_t hidden, n_experts, inter, top_k;
  bool norm_topk_prob;
  float routed_scaling_factor;
};
int64_t moe_decode_scratch_bytes(int64_t n_tokens, const MoeDims& dims, int64_t elem_bytes);
template <typename T>
void moe_decode(float* x, T* norm_out, const T* in, const T* gate, const float* expert_bias, const T* w13,
                const T* w2, const float* done, const float* next_norm, float eps, int64_t n_tokens,
                const MoeDims& dims, void* scratch, cudaStream_t stream);

// --- sample.cu: token choice's end-of-sequence rules (greedy generation chooses on the device;
// sampling on the host, cpu::choose_tokens). apply_eos (cpu::choose_tokens' rule, its arguments in
// the same order: the top-1 for the logits, first_seq for seq_ids, eos for params.eos):
// tokens[i] = top[i], or, once sequence first_seq + i has ended, the EOS id it produced; ended (one
// per sequence, -1 = cpu::kNotEnded until then) set to the token when a token is an EOS id.
// slots (device, n) or null: row i's sequence state is ended[slots[i]] instead (the batch API's slots;
// the twin's seq_ids).
void apply_eos(int32_t* tokens, const int32_t* top, int64_t n, int64_t first_seq, const int32_t* eos, int n_eos,
               int32_t* ended, cudaStream_t stream, const int32_t* slots = nullptr);
// restart_ended (the CPU stage's restart): ended[slots[i]] = -1 (cpu::kNotEnded) for i < n; slots device.
void restart_ended(int32_t* ended, const int32_t* slots, int64_t n, cudaStream_t stream);
// finished_flags (cpu::finished_flags): flags[i] = 1 where tokens[i] is one of the n_eos EOS ids, else 0.
void finished_flags(float* flags, const int32_t* tokens, int64_t n, const int32_t* eos, int n_eos,
                    cudaStream_t stream);

// --- The paged KV cache (kernels/paged_kv.h: pools [n_pages, page_size, n_kv_heads, head_dim],
// block_table int32 [.., max_pages], one PagedSeq per sequence of the step; all device arrays, so a
// CUDA Graph replays any step once they are rewritten). A row's bits depend on its sequence's
// tokens and position only: not on the batch, the other rows, the page size or page placement.
// rope_store.cu (cpu::qk_norm_rope_store): qk_norm_rope on the rows of seqs at their positions
// (the same bits), in place on qkv (n_rows, (n_heads + 2 n_kv_heads) head_dim), and each row's k and
// v into its page. One block per row of the n_rows (rows of no sequence, padding, are skipped; so is
// the store of a row past the table or on a negative entry). head_dim even, <= 256.
template <typename T>
void qk_norm_rope_store(T* qkv, T* k_pool, T* v_pool, const float* q_norm, const float* k_norm, const float* inv_freq,
                        const PagedSeq* seqs, int64_t n_seqs, int64_t n_rows, const int32_t* block_table,
                        int64_t max_pages, int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                        float eps, cudaStream_t stream);
// The same into an fp8 cache (paged_kv.h): k_pool, v_pool e4m3 [n_pages, page_size, n_kv_heads,
// head_dim], k_scale, v_scale fp32 [n_pages, page_size, n_kv_heads]; each k and v head row as rounded
// to T (qkv's k after the store), quantized by cpu::qk_norm_rope_store_fp8's rule, the same bits.
template <typename T>
void qk_norm_rope_store_fp8(T* qkv, uint8_t* k_pool, uint8_t* v_pool, float* k_scale, float* v_scale,
                            const float* q_norm, const float* k_norm, const float* inv_freq, const PagedSeq* seqs,
                            int64_t n_seqs, int64_t n_rows, const int32_t* block_table, int64_t max_pages,
                            int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float eps,
                            cudaStream_t stream);
// attention_paged_decode.cu (cpu::attention_paged, one row per sequence): flash-decoding. Each
// entry of seqs is one decode row (n_rows is taken as 1): q row `row` at position first_pos over
// cache positions 0..first_pos. out rows of n_heads * head_dim at the q rows' indices; q rows of
// q_stride elements (0: dense; qkv rows: (n_heads + 2 n_kv_heads) head_dim). Split-KV in fixed
// 512-position (or longer, at most 16 splits) pieces of the cache length alone, merged in order.
// workspace: attention_decode_paged_workspace_bytes(n_seqs, n_heads, head_dim, max_pages *
// page_size) bytes, 16-byte aligned. head_dim 16, 32, 64, 128; n_heads / n_kv_heads <= 16;
// q, pools 16-byte aligned. bf16/fp16 on tensor cores, fp32 exact SIMT.
int64_t attention_decode_paged_workspace_bytes(int64_t n_seqs, int64_t n_heads, int64_t head_dim, int64_t max_len);
template <typename T>
void attention_decode_paged(T* out, const T* q, const T* k_pool, const T* v_pool, const PagedSeq* seqs,
                            int64_t n_seqs, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, void* workspace,
                            cudaStream_t stream, int64_t q_stride = 0);
// The same over an fp8 cache (pools and scales as qk_norm_rope_store_fp8's): each K / V tile widened
// to T times its rows' scales in shared memory (e4m3 * s in fp32, rounded to T), then the same
// arithmetic. bf16 / fp16 only (fp32 is refused); the pools 16-byte aligned, head_dim 16 .. 128.
template <typename T>
void attention_decode_paged_fp8(T* out, const T* q, const uint8_t* k_pool, const uint8_t* v_pool,
                                const float* k_scale, const float* v_scale, const PagedSeq* seqs, int64_t n_seqs,
                                const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                                int64_t n_kv_heads, int64_t head_dim, float scale, void* workspace,
                                cudaStream_t stream, int64_t q_stride = 0);
// attention_paged_prefill.cu (cpu::attention_paged): chunked prefill, causal, every row of every
// sequence of seqs against its cache (the chunk's k/v stored first); max_rows (host) bounds every
// n_rows (the grid). Several sequences' chunks at any first_pos in one launch; a row's bits do not
// depend on the chunk size, and a whole prompt gives attention()'s bits. Same layouts and limits as
// attention_decode_paged (n_heads / n_kv_heads <= 64).
template <typename T>
void attention_prefill_paged(T* out, const T* q, const T* k_pool, const T* v_pool, const PagedSeq* seqs,
                             int64_t n_seqs, int64_t max_rows, const int32_t* block_table, int64_t max_pages,
                             int64_t page_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                             cudaStream_t stream, int64_t q_stride = 0);
// The same over an fp8 cache (as attention_decode_paged_fp8). bf16 / fp16 only.
template <typename T>
void attention_prefill_paged_fp8(T* out, const T* q, const uint8_t* k_pool, const uint8_t* v_pool,
                                 const float* k_scale, const float* v_scale, const PagedSeq* seqs, int64_t n_seqs,
                                 int64_t max_rows, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                 cudaStream_t stream, int64_t q_stride = 0);

// --- argmax.cu: cpu::argmax_margin on the GPU (the head's next token and its margin over the
// runner-up). out, margin (n_rows); in (n_rows, n_cols) fp32.
void argmax_margin(int32_t* out, float* margin, const float* in, int64_t n_rows, int64_t n_cols, cudaStream_t stream);

// --- add.cu: fp32 -> T on the device (n elements).
template <typename T>
void convert_from_f32(T* out, const float* in, int64_t n, cudaStream_t stream);

// --- nonfinite.cu: *count += the number of NaN / +-Inf among in[0, n) (cpu::count_nonfinite).
// count: device memory or pinned host memory (mapped under UVA), zeroed by the caller; one atomicAdd per warp
// that saw any, none when all are finite.
void count_nonfinite(unsigned int* count, const float* in, int64_t n, cudaStream_t stream);

}  // namespace lfm2::cuda
