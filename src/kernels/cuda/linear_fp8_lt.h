// The prompt rows' FP8 projections (docs/fp8.md, "The CUDA stage on an FP8 file"): cuBLASLt's FP8
// matmul on Hopper, e4m3 x e4m3 with fp32 accumulation and the scales applied inside the kernel.
// The weight as the file holds it ((n_out, n_in) e4m3, its scales per output row (channel:
// CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) or per 128 x 128 block (block128: BLK128x128_32F, the
// file's (n_out / 128, n_in / 128) row-major with each row padded to a multiple of
// kFp8LtScaleColumns k blocks: cuBLASLt reads row b of them at b x that multiple; H100, DN8L call 1:
// unpadded, 256 -> 384 gave zeros past the second block row)); the activations quantized by
// moe_quantize_e4m3 as one group (kernels/cuda/grouped_gemm_fp8.h: (n_in / 128, n_rows) k-block
// major, per row (channel: its first n_rows are the OUTER_VEC scales) or per (row, 128 columns)
// (block128: VEC128_32F)). One algorithm per (shape, scheme, out kind) pinned as linear.cu pins
// (the heuristic's pick at 4,096 rows, no split-K), so a row's bits do not depend on n_rows.
// The CPU twin: cpu::linear_fp8_act (kernels/fp8_products.h).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/fp8.h"
#include "kernels/cuda/linear_lt.h"

namespace lfm2::cuda {

// out (n_rows, n_out) = deq(in) deq(w)^T as T (kT: T is the out type), fp32 (kF32) or added into
// fp32 out (kAddF32). n_in a multiple of 128 (block128 also n_out); 16-byte aligned buffers. Queues
// one cuBLASLt matmul (capturable); the first call of a shape asks the heuristic (host work).
template <typename T>
void linear_fp8_lt(void* out, LtOut kind, const uint8_t* in, const float* in_scales, const uint8_t* w,
                   const float* w_scales, Fp8Scheme scheme, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream);

// The activations of linear_fp8_lt: q (n_rows, cols) e4m3 and its scales, quantized per row
// (channel) or per (row, 128 columns) (block128), moe_quantize_e4m3 over one group. offsets: 2
// device ints of scratch, written here ({0, n_rows}) by a one-thread kernel.
template <typename T>
void quantize_rows_fp8_lt(uint8_t* q, float* scales, int32_t* offsets, const T* x, Fp8Scheme scheme, int64_t n_rows,
                          int64_t cols, cudaStream_t stream);

// Row counts linear_fp8_lt takes: multiples of this. cuBLASLt's block128 algorithm (pinned at 4,096
// rows) refuses 1 row and some ragged counts (H100, CUDA 13.0, DN8 call 2); the activations'
// VEC128 scales are (n_in / 128, n_rows) with n_rows their leading dimension.
constexpr int64_t kFp8LtRowQuantum = 128;
// block128 weight scales: a row of n_in / 128 k blocks padded to a multiple of this (above).
constexpr int64_t kFp8LtScaleColumns = 4;

// A projection of any n_rows T rows on the FP8 tensor cores: in quantized (quantize_rows_fp8_lt),
// then linear_fp8_lt on the first n_rows - n_rows % kFp8LtRowQuantum rows as they are and the rest
// padded with zero rows to kFp8LtRowQuantum in scratch (their output copied out of scratch; kAddF32
// copies the residual's rows in first). A row's bits depend on that row alone (the pinned
// algorithm, its own scales), whatever n_rows and its place among them. Queues kernels, cuBLASLt
// matmuls and device copies only (capturable). scratch: linear_fp8_scratch_bytes at least (for
// dims no larger than its arguments), 256-byte aligned.
int64_t linear_fp8_scratch_bytes(int64_t n_rows, int64_t n_in, int64_t n_out);
template <typename T>
void linear_fp8(void* out, LtOut kind, const T* in, const uint8_t* w, const float* w_scales, Fp8Scheme scheme,
                int64_t n_rows, int64_t n_in, int64_t n_out, void* scratch, cudaStream_t stream);

// linear_fp8 on rows quantized before (rmsnorm_quantize_e4m3, the same codes and scales as
// linear_fp8's own quantization, so the same bits): q (n_rows, n_in) e4m3, the scale of (row r, 128
// columns g) at q_scales[g * q_ld + r], q_ld >= n_rows. Scratch as linear_fp8's.
template <typename T>
void linear_fp8_quantized(void* out, LtOut kind, const uint8_t* q, const float* q_scales, int64_t q_ld,
                          const uint8_t* w, const float* w_scales, Fp8Scheme scheme, int64_t n_rows, int64_t n_in,
                          int64_t n_out, void* scratch, cudaStream_t stream);

}  // namespace lfm2::cuda
