// A step's row to its sequence on the device (kernels/paged_kv.h's PagedSeq array), for the kernels
// that run one row (or one row's part) per thread or block: the RoPE + KV store, the conv step.
#pragma once

#include "kernels/paged_kv.h"

namespace lfm2::cuda {

// The last sequence whose first row is <= row, or -1 (seqs ordered by row; a binary search).
template <typename Row>
__device__ __forceinline__ int find_seq(const PagedSeq* seqs, int n_seqs, Row row) {
  int lo = 0, hi = n_seqs - 1, found = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (seqs[mid].row <= row) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

}  // namespace lfm2::cuda
