#include "plan/microbatch.h"

#include <algorithm>
#include <vector>

#include "plan/gpu_costs.h"

namespace lfm2 {

int64_t default_microbatch(int64_t n_seq, int64_t seq_len, int n_ranks, bool gpu) {
  if (!gpu) return std::max<int64_t>(1, n_microbatches(n_seq, 4 * int64_t(n_ranks)));
  constexpr int64_t kMaxTokens = 16384;
  const int64_t S = std::max<int64_t>(seq_len, 1);
  int64_t best = 1;
  double best_time = 1e300;
  // Candidates: powers of two, and the whole batch; a smaller one wins only when strictly faster.
  std::vector<int64_t> sizes;
  for (int64_t mb = 1; mb < n_seq; mb *= 2) sizes.push_back(mb);
  sizes.push_back(n_seq);
  for (int64_t mb : sizes) {
    if (mb > 1 && mb * S > kMaxTokens) break;
    const int64_t M = n_microbatches(n_seq, mb);
    const double t = double(M + n_ranks - 1) * double(mb * S) / gpu_microbatch_efficiency(mb * S);
    if (t < best_time * (1 - 1e-9)) {
      best_time = t;
      best = mb;
    }
  }
  return best;
}

}  // namespace lfm2
