// The one fp32 dot product every CPU op uses, so that a given (row, column) always gets the
// same bits whichever op, blocking or thread computes it.
//
// Eight interleaved fp32 partial sums (lane j takes elements j, j+8, ...), combined pairwise at the
// end; compilers vectorize it without -ffast-math. Inline: it is the innermost loop.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace lfm2::cpu
