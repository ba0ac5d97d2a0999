// RMSNorm on the CPU: one row per work item, fp32 sum of squares (kernels/dot.h order).
#include "kernels/rmsnorm.h"

#include <cmath>

#include "common/parallel.h"
#include "kernels/dot.h"

namespace lfm2::cpu {

void rmsnorm(float* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             int n_threads) {
  parallel_for(n_rows, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = in + r * dim;
      float* y = out + r * dim;
      const float var = dot(x, x, dim) / float(dim);
      const float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t i = 0; i < dim; ++i) y[i] = weight[i] * (x[i] * inv);  // HF order: w * (x * rsqrt)
    }
  }, 64);
}

}  // namespace lfm2::cpu
