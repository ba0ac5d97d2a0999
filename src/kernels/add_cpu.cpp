// Residual add on the CPU: elementwise.
#include "kernels/add.h"

#include "common/parallel.h"

namespace lfm2::cpu {

void add(float* out, const float* a, const float* b, int64_t n, int n_threads) {
  parallel_for(n, n_threads, [&](int64_t bg, int64_t e, int) {
    for (int64_t i = bg; i < e; ++i) out[i] = a[i] + b[i];
  }, 1 << 15);
}

}  // namespace lfm2::cpu
