// The FP8 grouped GEMM of the experts for prefill (issue 23; not yet wired into the stage): e4m3
// activations x e4m3 weights with fp32 block scales, fp32 accumulation, bf16 out, on CUTLASS's sm90
// ptr-array kernel with blockwise scaling (KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise:
// each 128-deep k block's wgmma products are scaled by scale_a(row, k block) * scale_w(n block,
// k block) and added into the fp32 accumulators). Scales: activations one per (row, 128 columns),
// DeepSeek-V3's grouping (docs/fp8.md); weights one per 128 x 128 block, the block128 scheme.
// The CPU twin: kernels/moe_grouped_fp8.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace lfm2::cuda {

// The e4m3 activations of rows grouped by expert (offsets[e] .. offsets[e+1] - 1 are expert e's):
// q (n_rows, cols) = e4m3(x / s) rounded to nearest even, saturating, s = amax / 448 of each row's
// group of 128 columns (amax 0: s = 1), fp8_quantize's rule. The scales as the grouped GEMM reads
// them: expert e's block at scales + offsets[e] * (cols / 128), k-block major ((cols / 128) runs of
// its rows). cols a multiple of 128; 16-byte aligned pointers. Never allocates.
template <typename T>
void moe_quantize_e4m3(uint8_t* q, float* scales, const T* x, const int32_t* offsets, int64_t n_rows,
                       int64_t n_experts, int64_t cols, cudaStream_t stream);

// out (rows, n_out) = deq(in) deq(W_e)^T for expert e's rows, in and in_scales from
// moe_quantize_e4m3, W (n_experts, n_out, n_in) e4m3 and w_scales (n_experts, n_in / 128,
// n_out / 128) fp32: each expert's 128 x 128 block scales k-block major (the transpose of the weight
// file's (n_out / 128, n_in / 128) per expert: CUTLASS's sm90 scales are MN-major). n_in, n_out
// multiples of 128; Hopper (sm_90a). workspace: moe_grouped_matmul_fp8_workspace_bytes. Queues two
// kernels (argument setup, the GEMM); never allocates or synchronises.
int64_t moe_grouped_matmul_fp8_workspace_bytes(int64_t n_experts);
void moe_grouped_matmul_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, const int32_t* offsets, int64_t max_rows, int64_t n_experts,
                            int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream);

}  // namespace lfm2::cuda

// The CUTLASS side (moe_grouped_gemm_fp8.cu, compiled for sm_90a only; no CUTLASS in this header):
// the argument arrays + CUTLASS's workspace, and the kernel on arguments already checked.
namespace lfm2::cuda::grouped {
size_t fp8_workspace_bytes(int64_t n_experts, int sm_count);
void run_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w, const float* w_scales,
             const int32_t* offsets, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count,
             int device, cudaStream_t stream);
}  // namespace lfm2::cuda::grouped
