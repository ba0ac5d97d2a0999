// cuBLASLt products with a second pinned algorithm per shape (linear.cu): the heuristic's pick at
// `plan_rows` rows without split-K, reused for every row count, so that each output element is one
// dot product in the same k order whatever n_rows is (tested across 1..256 rows on the GPU). Used
// by linear_decode.cu for the decode projections, where the pinned large-M algorithm is slow.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace lfm2::cuda {

enum class LtOut { kT, kF32, kAddF32 };  // out is T (linear), fp32 (linear_f32out), fp32 += (linear_add_f32)

template <typename T>
void linear_lt_at(void* out, LtOut kind, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                  int64_t plan_rows, cudaStream_t stream);

}  // namespace lfm2::cuda
