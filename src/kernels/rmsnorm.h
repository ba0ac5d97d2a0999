// RMSNorm over the last dimension of each row, as HF Lfm2MoeRMSNorm in fp32:
//   out = weight * (x * rsqrt(mean(x^2) + eps))
// Used for the hidden states (rows = tokens, dim = hidden) and per head for q/k
// (rows = tokens * heads, dim = head_dim).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out, in (n_rows, dim), out may equal in; weight (dim).
void rmsnorm(float* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             int n_threads = 1);

}  // namespace lfm2::cpu
