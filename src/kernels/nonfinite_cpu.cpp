// cpu::count_nonfinite: each thread counts a contiguous chunk and finds its first; chunks in order.
#include <cmath>
#include <vector>

#include "common/parallel.h"
#include "kernels/nonfinite.h"

namespace lfm2::cpu {

int64_t count_nonfinite(const float* in, int64_t n, int64_t* first, int n_threads) {
  const int workers = resolve_threads(n_threads);
  std::vector<int64_t> count(size_t(workers), 0), at(size_t(workers), -1);
  parallel_for(
      n, workers,
      [&](int64_t b, int64_t e, int w) {
        int64_t c = 0, f = -1;
        for (int64_t i = b; i < e; ++i)
          if (!std::isfinite(in[i])) {
            if (c++ == 0) f = i;
          }
        count[size_t(w)] = c;
        at[size_t(w)] = f;
      },
      int64_t(1) << 16);
  int64_t total = 0, first_at = -1;
  for (int w = 0; w < workers; ++w) {
    if (first_at < 0 && at[size_t(w)] >= 0) first_at = at[size_t(w)];
    total += count[size_t(w)];
  }
  if (first) *first = first_at;
  return total;
}

}  // namespace lfm2::cpu
