// Top-1 of each row: the index of the largest value, the first one among equals (NaN never wins),
// and its margin over the runner-up (the head's confidence: 0 on an exact tie).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out (n_rows); in (n_rows, n_cols).
void argmax(int32_t* out, const float* in, int64_t n_rows, int64_t n_cols, int n_threads = 1);

// argmax, and margin (n_rows) = in[top-1] - the largest value at any other index (NaN values are
// skipped; a row with one column has margin +inf; a row of NaN gives index 0 and margin NaN).
void argmax_margin(int32_t* out, float* margin, const float* in, int64_t n_rows, int64_t n_cols, int n_threads = 1);

}  // namespace lfm2::cpu
