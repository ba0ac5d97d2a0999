// The MoE's rows sorted by expert (offsets[e] .. offsets[e + 1] - 1 are expert e's): a row's expert,
// for kernels that walk the rows (moe_grouped_fp8.cu, moe_combine.cu). Included by .cu only.
#pragma once

#include <cstdint>

namespace lfm2::cuda {

// The last of n_experts whose first row (offsets ascending, offsets[n_experts] past the last) is
// <= row, by binary search; its first row r0 and its row count m.
__device__ __forceinline__ int row_expert(int64_t row, const int32_t* offsets, int n_experts, int64_t& r0,
                                          int64_t& m) {
  int lo = 0, hi = n_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (offsets[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  r0 = offsets[lo];
  m = offsets[lo + 1] - r0;
  return lo;
}

}  // namespace lfm2::cuda
