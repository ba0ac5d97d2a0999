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
// RMSNorm of the last token of each sequence only: out (n_seq, dim); in (n_seq * seq_len, dim).
template <typename T>
void rmsnorm_last(T* out, const float* in, const float* weight, int64_t n_seq, int64_t seq_len, int64_t dim,
                  float eps, cudaStream_t stream);

// --- add.cu: out = a + b (n); out may equal a. The residual add when no norm follows.
template <typename T>
void add(float* out, const float* a, const T* b, int64_t n, cudaStream_t stream);

// --- linear.cu: out (n_rows, n_out) = in (n_rows, n_in) W^T, W (n_out, n_in), through cuBLAS with
// fp32 accumulation: fp32 exact unless tf32; bf16/fp16 on tensor cores. linear_f32out writes fp32
// (router logits, LM head).
template <typename T>
void linear(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream,
            bool tf32 = false);
template <typename T>
void linear_f32out(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32 = false);

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

// --- swiglu.cu: out (n_rows, inter) = silu(gate) * up where gate_up rows are [gate (inter) | up (inter)]
// (cpu::swiglu on each row's two halves: the layout of one GEMM over stacked [w1; w3]).
template <typename T>
void swiglu(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream);

// --- moe_router.cu: cpu::moe_router on the GPU. weights, experts (n_tokens, top_k); logits
// (n_tokens, n_experts) fp32; expert_bias (n_experts) or null. Ties: the lower expert index.
// n_experts <= 1024, top_k <= 32.
void moe_router(float* weights, int32_t* experts, const float* logits, const float* expert_bias, int64_t n_tokens,
                int64_t n_experts, int64_t top_k, bool norm_topk_prob, float routed_scaling_factor,
                cudaStream_t stream);

// --- moe_permute.cu: the (token, slot) pairs sorted by expert, stably (token order within an expert),
// on the device: offsets (n_experts + 1), the first permuted row of each expert's group;
// src_token (n_tokens * top_k), the token each permuted row comes from; dest_row (n_tokens * top_k),
// the permuted row of (token, slot). scratch: moe_permute_scratch_ints() ints. n_experts <= 1024.
int64_t moe_permute_scratch_ints(int64_t n_tokens, int64_t n_experts, int64_t top_k);
void moe_permute(int32_t* offsets, int32_t* src_token, int32_t* dest_row, const int32_t* experts, int64_t n_tokens,
                 int64_t n_experts, int64_t top_k, int32_t* scratch, cudaStream_t stream);

// --- moe_grouped_matmul.cu: for each expert e and each row r in [offsets[e], offsets[e+1]):
// out[r] = in[gather ? gather[r] : r] W_e^T; out (max_rows, n_out); W (n_experts, n_out, n_in).
// The row counts stay on the device: the grid covers the worst case (max_rows rows in all) and
// tiles past an expert's rows exit. bf16/fp16: tensor cores (wmma, fp32 accumulation); fp32: a tiled
// SIMT kernel (exact fp32).
template <typename T>
void moe_grouped_matmul(T* out, const T* in, const int32_t* gather, const T* weight, const int32_t* offsets,
                        int64_t max_rows, int64_t n_experts, int64_t n_in, int64_t n_out, cudaStream_t stream);

// --- moe_combine.cu: weighted un-permutation fused with the residual add:
// x[t] += sum over t's experts in ascending order of weights[t, k] * expert_out[dest_row[t, k]]
// (fp32, fixed order, no atomics). top_k <= 32.
template <typename T>
void moe_combine(float* x, const T* expert_out, const int32_t* dest_row, const float* weights, int64_t n_tokens,
                 int64_t top_k, int64_t hidden, cudaStream_t stream);

// --- moe_experts.cu: cpu::moe_experts followed by cpu::add into the residual, composed from the
// kernels above: x (n_tokens, hidden) fp32 += experts(in). in (n_tokens, hidden);
// w13 (n_experts, 2 * inter, hidden), each expert's w1 rows then its w3 rows; w2 (n_experts, hidden,
// inter); experts, weights (n_tokens, top_k) from moe_router(); scratch of moe_experts_scratch_bytes().
int64_t moe_experts_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                                  int64_t elem_bytes);
template <typename T>
void moe_experts(float* x, const T* in, const T* w13, const T* w2, const int32_t* experts, const float* weights,
                 int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                 cudaStream_t stream);

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
