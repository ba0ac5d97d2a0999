// Residual add: out = a + b, elementwise.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out, a, b (n); out may equal a or b.
void add(float* out, const float* a, const float* b, int64_t n, int n_threads = 1);

}  // namespace lfm2::cpu
