// Non-finite values: how many elements of a buffer are NaN or +-Inf, and where the first is. The
// check lfm2-rank runs on every microbatch's hidden states and logits (model/checked_stage.h).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// The number of NaN / +-Inf among in[0, n); *first (if given) the index of the first, or -1.
int64_t count_nonfinite(const float* in, int64_t n, int64_t* first = nullptr, int n_threads = 1);

}  // namespace lfm2::cpu
