// FP8 matrices back to full precision (docs/fp8.md): the CPU twin of cuda::fp8_dequantize
// (kernels/cuda/fp8_ops.h), which the CUDA stage runs to give its prompt rows' grouped GEMM the
// experts of an FP8 file it keeps in e4m3.
#pragma once

#include <cstdint>

#include "common/fp8.h"

namespace lfm2::cpu {

// n_mats matrices (rows, cols) of e4m3 bits back to back, each with its own scales back to back
// (fp8_scale_rows x fp8_scale_cols of the scheme): out = q * scale in fp32, as fp8_dequantize does
// for one. An expert stack (n_experts, rows, cols) is n_experts matrices; the gate/up stack of
// each expert's w1 rows then w3 rows, each half with its own scales, is 2 n_experts of (inter, hidden).
void fp8_dequantize_mats(float* out, const uint8_t* q, const float* scale, Fp8Scheme scheme, int64_t n_mats,
                         int64_t rows, int64_t cols);

}  // namespace lfm2::cpu
