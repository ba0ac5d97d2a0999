// Linear layer without bias, nn.Linear layout: out = in W^T.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out (n_rows, n_out); in (n_rows, n_in); weight (n_out, n_in). fp32 accumulation.
void linear(float* out, const float* in, const float* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
            int n_threads = 1);

}  // namespace lfm2::cpu
