// Short conv on the CPU: one token row per work item; taps summed in order j = 0..L-1 in fp32,
// skipping taps that fall before the sequence start (they are zeros).
#include "kernels/short_conv.h"

#include "common/parallel.h"

namespace lfm2::cpu {

void short_conv(float* out, const float* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden,
                int64_t L, int n_threads) {
  parallel_for(n_seq * seq_len, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t t = row % seq_len;
      const float* C = bcx + row * 3 * hidden + hidden;
      float* y = out + row * hidden;
      for (int64_t c = 0; c < hidden; ++c) {
        float z = 0;
        for (int64_t j = 0; j < L; ++j) {
          const int64_t tt = t - (L - 1) + j;
          if (tt < 0) continue;
          const float* src = bcx + (row - t + tt) * 3 * hidden;
          z += conv_w[c * L + j] * (src[c] * src[2 * hidden + c]);  // u = B * x
        }
        y[c] = C[c] * z;
      }
    }
  }, 64);
}

void short_conv_state(float* state, const float* bcx, int64_t length, int64_t hidden, int64_t L) {
  for (int64_t j = 0; j < L - 1; ++j) {
    const int64_t t = length - (L - 1) + j;
    float* dst = state + j * hidden;
    const float* src = bcx + t * 3 * hidden;
    for (int64_t c = 0; c < hidden; ++c) dst[c] = t < 0 ? 0.0f : src[c] * src[2 * hidden + c];
  }
}

void short_conv_decode(float* out, const float* bcx, const float* conv_w, float* state, const int64_t* positions,
                       int64_t n, int64_t hidden, int64_t L, int n_threads) {
  parallel_for(n, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float* B = bcx + i * 3 * hidden;
      const float* C = B + hidden;
      const float* X = B + 2 * hidden;
      float* st = state + i * (L - 1) * hidden;
      float* y = out + i * hidden;
      const int64_t t = positions[i];
      for (int64_t c = 0; c < hidden; ++c) {
        const float u = B[c] * X[c];
        float z = 0;
        for (int64_t j = 0; j < L; ++j) {
          if (t - (L - 1) + j < 0) continue;
          z += conv_w[c * L + j] * (j < L - 1 ? st[j * hidden + c] : u);
        }
        y[c] = C[c] * z;
        for (int64_t j = 0; j + 1 < L - 1; ++j) st[j * hidden + c] = st[(j + 1) * hidden + c];
        if (L > 1) st[(L - 2) * hidden + c] = u;
      }
    }
  }, 16);
}

}  // namespace lfm2::cpu
