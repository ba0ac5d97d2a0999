// RoPE on the CPU: per token, the angles' cos/sin in double (rounded to fp32), applied to every head.
#include "kernels/rope.h"

#include <cmath>

#include "common/error.h"
#include "common/parallel.h"

namespace lfm2::cpu {

void rope_inv_freq(float* inv_freq, int64_t head_dim, double theta) {
  // torch: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=float32) / dim)), all fp32.
  const float base = float(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float expo = float(2 * i) / float(head_dim);
    inv_freq[i] = 1.0f / powf(base, expo);
  }
}

void rope(float* out, const float* in, const int64_t* positions, const float* inv_freq, int64_t n_tokens,
          int64_t n_heads, int64_t head_dim, int n_threads) {
  constexpr int64_t kMaxHalf = 512;
  const int64_t half = head_dim / 2;
  LFM2_CHECK(head_dim % 2 == 0 && half <= kMaxHalf, "rope: head_dim ", head_dim, " must be even and <= ",
             2 * kMaxHalf);
  parallel_for(n_tokens, n_threads, [&](int64_t b, int64_t e, int) {
    float cs[kMaxHalf], sn[kMaxHalf];
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(positions[t]) * double(inv_freq[i]);
        cs[i] = float(std::cos(a));
        sn[i] = float(std::sin(a));
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* x = in + (t * n_heads + h) * head_dim;
        float* y = out + (t * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          y[i] = x1 * cs[i] + (-x2) * sn[i];
          y[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
  }, 16);
}

}  // namespace lfm2::cpu
