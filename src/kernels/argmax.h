// Top-1 of each row: the index of the largest value, the first one among equals (NaN never wins).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out (n_rows); in (n_rows, n_cols).
void argmax(int32_t* out, const float* in, int64_t n_rows, int64_t n_cols, int n_threads = 1);

}  // namespace lfm2::cpu
