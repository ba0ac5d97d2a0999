// MoE router on the CPU: one token per work item; top-k by repeated selection of the best
// remaining expert (strict >, so the lowest index wins among equals; a NaN score ranks as -inf).
#include "kernels/moe_router.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/parallel.h"

namespace lfm2::cpu {

void moe_router(float* weights, int32_t* experts, const float* logits, const float* expert_bias, int64_t n_tokens,
                int64_t n_experts, int64_t top_k, bool norm_topk_prob, float routed_scaling_factor, int n_threads) {
  constexpr int64_t kMaxExperts = 1024;
  LFM2_CHECK(n_experts <= kMaxExperts && top_k >= 1 && top_k <= n_experts, "moe_router: top_k ", top_k,
             " of ", n_experts, " experts (at most ", kMaxExperts, ")");
  parallel_for(n_tokens, n_threads, [&](int64_t b, int64_t e, int) {
    float prob[kMaxExperts], score[kMaxExperts];
    bool taken[kMaxExperts];
    for (int64_t t = b; t < e; ++t) {
      for (int64_t x = 0; x < n_experts; ++x) {
        prob[x] = sigmoid(logits[t * n_experts + x]);
        score[x] = expert_bias ? prob[x] + expert_bias[x] : prob[x];
        if (score[x] != score[x]) score[x] = -std::numeric_limits<float>::infinity();  // as on the GPU
        taken[x] = false;
      }
      float* w = weights + t * top_k;
      int32_t* ex = experts + t * top_k;
      for (int64_t k = 0; k < top_k; ++k) {
        int64_t best = -1;
        for (int64_t x = 0; x < n_experts; ++x)
          if (!taken[x] && (best < 0 || score[x] > score[best])) best = x;
        taken[best] = true;
        ex[k] = int32_t(best);
        w[k] = prob[best];
      }
      if (norm_topk_prob) {
        float sum = 0;
        for (int64_t k = 0; k < top_k; ++k) sum += w[k];
        const float denom = sum + 1e-6f;
        for (int64_t k = 0; k < top_k; ++k) w[k] /= denom;
      }
      for (int64_t k = 0; k < top_k; ++k) w[k] *= routed_scaling_factor;
    }
  }, 16);
}

void moe_drop_rows(int32_t* experts, const float* done, int64_t n_tokens, int64_t top_k) {
  for (int64_t t = 0; t < n_tokens; ++t)
    if (done[t] != 0.0f) std::fill(experts + t * top_k, experts + (t + 1) * top_k, -1);
}

}  // namespace lfm2::cpu
