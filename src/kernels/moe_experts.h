// The routed experts of an MoE layer (HF Lfm2MoeExperts), stacked weights:
//   out[t] = sum over t's picked experts e, in ascending e: weight * W2_e (silu(W1_e x[t]) * (W3_e x[t]))
// Ascending expert order starting from zero is HF's index_add_ order, so the fp32 sums match.
// Tokens are grouped by expert (a counting sort in the caller's scratch); each chunk of an expert's
// tokens is gathered and multiplied with kernels/linear.h, so every product is dot()'s arithmetic.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

struct MoeScratchSize {
  int64_t floats = 0, ints = 0;
};

// Scratch moe_experts() needs for n_tokens and n_threads (0: hardware concurrency).
MoeScratchSize moe_experts_scratch(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                   int64_t top_k, int n_threads);

// out, in (n_tokens, hidden); w1, w3 (n_experts, inter, hidden); w2 (n_experts, hidden, inter);
// experts, weights (n_tokens, top_k) from moe_router(); scratch sized by moe_experts_scratch().
// An expert of -1 (moe_drop_rows) is a dropped pair: it adds nothing and costs nothing.
// fp8_act_group: 0 leaves the activations as they are; otherwise each product's input rows (the
// gathered tokens, the SwiGLU output) are FP8-quantized as the GPU's FP8 path does
// (fp8_fake_quantize_rows, common/fp8.h): per row (kFp8PerRow) or per group of that many columns.
inline constexpr int64_t kFp8PerRow = -1;
void moe_experts(float* out, const float* in, const float* w1, const float* w3, const float* w2,
                 const int32_t* experts, const float* weights, int64_t n_tokens, int64_t hidden, int64_t n_experts,
                 int64_t inter, int64_t top_k, float* scratch, int32_t* int_scratch, int n_threads = 1,
                 int64_t fp8_act_group = 0);

}  // namespace lfm2::cpu
