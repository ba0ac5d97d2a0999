// The MoE block of an FP8 file's experts kept in e4m3 on a 16-bit CUDA stage (docs/fp8.md): the
// routed experts read half the bytes a step. Decode rows: the router of moe_decode
// (moe_route_decode), then on its permutation the FP8 x FP8 products (moe_experts_decode_fp8_routed:
// the tokens and act quantized to e4m3), whose combine adds into x and fuses the next layer's
// operator norm. Prompt rows: the layer's experts widened to T (fp8_dequantize) into a
// scratch, then the bf16 path (router, CUTLASS grouped GEMM, combine) - the numbers the stage had
// when it dequantized at upload, bit for bit. Each kind's bits depend on its rows alone.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda/ops.h"
#include "model/cuda_weights.h"

namespace lfm2 {

// Bytes of the decode rows' scratch for n rows (the decode state's MoE workspace is at least this
// on an FP8 stage).
int64_t moe_fp8_decode_scratch_bytes(int64_t n, const cuda::MoeDims& d, int64_t elem_bytes);

// x (n, H) fp32 += experts(in) for decode rows; then, if next_norm, norm_out = rmsnorm(x) (eps).
// done (n) flags finished rows (they get nothing), as moe_decode.
template <typename T>
void moe_fp8_decode_rows(float* x, T* norm_out, const T* in, const DeviceLayerWeights<T>& lw, Fp8Scheme scheme,
                         const float* done, const float* next_norm, float eps, int64_t n, const cuda::MoeDims& d,
                         void* scratch, cudaStream_t stream);

// The layer's experts as T: w13 (E, 2 Im, H) and w2 (E, H, Im), for the prompt rows' grouped GEMM.
template <typename T>
void moe_fp8_widen_experts(T* w13, T* w2, const DeviceLayerWeights<T>& lw, Fp8Scheme scheme, const cuda::MoeDims& d,
                           cudaStream_t stream);

}  // namespace lfm2
