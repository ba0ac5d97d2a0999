// SwiGLU on the CPU: elementwise.
#include "kernels/swiglu.h"

#include "common/parallel.h"

namespace lfm2::cpu {

void swiglu(float* out, const float* gate, const float* up, int64_t n, int n_threads) {
  parallel_for(n, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) out[i] = silu(gate[i]) * up[i];
  }, 1 << 15);
}

}  // namespace lfm2::cpu
