// Linear on the CPU: threads split the output columns (weight rows); each thread walks blocks of
// weight rows (kept in cache) against every input row. Every output element is one kernels/dot.h
// call, so the result does not depend on the split.
#include "kernels/linear.h"

#include <algorithm>

#include "common/parallel.h"
#include "kernels/dot.h"

namespace lfm2::cpu {

void linear(float* out, const float* in, const float* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
            int n_threads) {
  constexpr int64_t kColBlock = 16;
  const int64_t n_blocks = (n_out + kColBlock - 1) / kColBlock;
  const int64_t min_blocks = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n_rows * n_in * kColBlock));
  parallel_for(n_blocks, n_threads, [&](int64_t bb, int64_t be, int) {
    for (int64_t blk = bb; blk < be; ++blk) {
      const int64_t j0 = blk * kColBlock, j1 = std::min(n_out, j0 + kColBlock);
      for (int64_t i = 0; i < n_rows; ++i) {
        const float* x = in + i * n_in;
        float* y = out + i * n_out;
        for (int64_t j = j0; j < j1; ++j) y[j] = dot(x, weight + j * n_in, n_in);
      }
    }
  }, min_blocks);
}

}  // namespace lfm2::cpu
