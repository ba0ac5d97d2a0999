// Argmax on the CPU: one row per work item, strict > so the first maximum wins.
#include "kernels/argmax.h"

#include <cmath>
#include <limits>

#include "common/parallel.h"

namespace lfm2::cpu {

void argmax(int32_t* out, const float* in, int64_t n_rows, int64_t n_cols, int n_threads) {
  parallel_for(n_rows, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = in + r * n_cols;
      int64_t best = 0;
      for (int64_t j = 1; j < n_cols; ++j)
        if (x[j] > x[best] || (x[best] != x[best] && x[j] == x[j])) best = j;
      out[r] = int32_t(best);
    }
  }, 16);
}

void argmax_margin(int32_t* out, float* margin, const float* in, int64_t n_rows, int64_t n_cols, int n_threads) {
  argmax(out, in, n_rows, n_cols, n_threads);
  parallel_for(n_rows, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = in + r * n_cols;
      const int64_t top = out[r];
      float second = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_cols; ++j)
        if (j != top && x[j] > second) second = x[j];
      margin[r] = x[top] - second;  // NaN when the whole row is NaN
    }
  }, 16);
}

}  // namespace lfm2::cpu
