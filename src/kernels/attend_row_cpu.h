// One query row's attention on the CPU, shared by the contiguous (attention_cpu.cpp) and paged
// (attention_paged_cpu.cpp) ops: the same loops whatever the cache's layout, so that a generated
// token gets the bits of a prefill.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dot.h"

namespace lfm2::cpu {

// o = softmax(q . k_j * scale) . v_j over positions j = 0..t, position j's key and value at
// k + row_of(j) and v + row_of(j): scores into p (t + 1 floats), their maximum, exp and sum, then
// the weighted sum of the values.
template <typename RowOf>
void attend_row(float* o, const float* q, const float* k, const float* v, const RowOf& row_of, int64_t t,
                int64_t head_dim, float scale, float* p) {
  float mx = -INFINITY;
  for (int64_t j = 0; j <= t; ++j) {
    p[j] = dot(q, k + row_of(j), head_dim) * scale;
    mx = std::fmax(mx, p[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j <= t; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < head_dim; ++d) o[d] = 0;
  for (int64_t j = 0; j <= t; ++j) {
    const float w = p[j] * inv;
    const float* vr = v + row_of(j);
    for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vr[d];
  }
}

}  // namespace lfm2::cpu
