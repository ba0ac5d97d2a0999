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

}  // namespace lfm2::cpu
