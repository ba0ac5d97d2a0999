// MoE routing from the router logits (HF Lfm2MoeTopKRouter), all options from the config:
//   s = sigmoid(logits)                                   # (n_tokens, n_experts)
//   pick the top_k experts by s + expert_bias (bias for selection only; no bias when null)
//   w = s[picked]; if norm_topk_prob: w /= (sum(w) + 1e-6); w *= routed_scaling_factor
// Picked experts come out in descending score order, as torch.topk(sorted=True) returns them.
// Ties: among equal scores the lower expert index is picked first. torch.topk on the CPU leaves
// the order of equal values unspecified (tools/make_goldens.py shows it does not follow the
// index), so an exact tie is the one case where this may pick differently from HF.
#pragma once

#include <cmath>
#include <cstdint>

namespace lfm2::cpu {

// weights, experts (n_tokens, top_k); logits (n_tokens, n_experts); expert_bias (n_experts) or null.
void moe_router(float* weights, int32_t* experts, const float* logits, const float* expert_bias, int64_t n_tokens,
                int64_t n_experts, int64_t top_k, bool norm_topk_prob, float routed_scaling_factor,
                int n_threads = 1);

// Generation: rows whose flag in `done` (n_tokens) is non-zero are finished sequences; their
// pairs get expert -1, which moe_experts skips (the row receives nothing from the experts).
void moe_drop_rows(int32_t* experts, const float* done, int64_t n_tokens, int64_t top_k);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace lfm2::cpu
