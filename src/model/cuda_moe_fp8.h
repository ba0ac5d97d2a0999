// The MoE block of an FP8 file's experts kept in e4m3 on a 16-bit CUDA stage (docs/fp8.md): the
// routed experts read half the bytes a step. Decode rows: the router of moe_decode
// (moe_route_decode), then on its permutation the FP8 x FP8 products (moe_experts_decode_fp8_routed:
// the tokens and the SwiGLU output quantized to e4m3), whose combine adds into x and fuses the next
// layer's operator norm. Prompt rows (routed by the caller): the FP8 tensor cores, e4m3 x e4m3
// (cuda::moe_experts_fp8); where hidden or inter is not a multiple of 128 (the small test models),
// the decode rows' e4m3 products. Both quantize activations per row (channel) or per (row, 128
// columns) (block128), as the CPU oracle's fp8_activations. Each kind's bits depend on its rows
// alone; a prompt row's and a decode row's differ.
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

// Whether prompt rows run on the FP8 tensor cores (hidden and inter multiples of 128).
bool moe_fp8_prompt_on_tensor_cores(const cuda::MoeDims& d);

// Bytes of the prompt rows' scratch for n rows.
int64_t moe_fp8_prompt_scratch_bytes(int64_t n, const cuda::MoeDims& d, int64_t elem_bytes);

// x (n, H) fp32 += experts(in) for prompt rows routed to experts with weights (n, top_k). in_q: in
// already quantized (on the tensor cores only; cuda::moe_experts_fp8's in_q, in_s, in_s_ld); next:
// the next layer's operator norm of the updated rows (on the tensor cores only; cuda::NextNorm).
template <typename T>
void moe_fp8_prompt_rows(float* x, const T* in, const DeviceLayerWeights<T>& lw, Fp8Scheme scheme,
                         const int32_t* experts, const float* weights, int64_t n, const cuda::MoeDims& d,
                         void* scratch, cudaStream_t stream, const uint8_t* in_q = nullptr,
                         const float* in_s = nullptr, int64_t in_s_ld = 0, const cuda::NextNorm<T>* next = nullptr);

}  // namespace lfm2
