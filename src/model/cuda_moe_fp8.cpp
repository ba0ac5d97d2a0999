#include "model/cuda_moe_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/align.h"
#include "common/error.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/grouped_gemm_fp8.h"

namespace lfm2 {
namespace {

// The decode rows' scratch: the router's outputs, then the products' scratch.
struct Fp8DecodeLayout {
  int64_t weights, experts, offsets, src_token, dest_row, rest, total;
};

Fp8DecodeLayout fp8_decode_layout(int64_t n, const cuda::MoeDims& d, int64_t elem_bytes) {
  const int64_t P = n * d.top_k;
  Fp8DecodeLayout l{};
  l.experts = l.weights + align_up(P * 4);
  l.offsets = l.experts + align_up(P * 4);
  l.src_token = l.offsets + align_up((d.n_experts + 1) * 4);
  l.dest_row = l.src_token + align_up(P * 4);
  l.rest = l.dest_row + align_up(P * 4);
  l.total = l.rest + cuda::moe_experts_decode_fp8_routed_scratch_bytes(n, d.hidden, d.inter, d.top_k, elem_bytes);
  return l;
}

}  // namespace

int64_t moe_fp8_decode_scratch_bytes(int64_t n, const cuda::MoeDims& d, int64_t elem_bytes) {
  return fp8_decode_layout(n, d, elem_bytes).total;
}

template <typename T>
void moe_fp8_decode_rows(float* x, T* norm_out, const T* in, const DeviceLayerWeights<T>& lw, Fp8Scheme scheme,
                         const float* done, const float* next_norm, float eps, int64_t n, const cuda::MoeDims& d,
                         void* scratch, cudaStream_t stream) {
  const Fp8DecodeLayout l = fp8_decode_layout(n, d, sizeof(T));
  char* base = static_cast<char*>(scratch);
  auto* weights = reinterpret_cast<float*>(base + l.weights);
  auto* experts = reinterpret_cast<int32_t*>(base + l.experts);
  auto ints = [&](int64_t at) { return reinterpret_cast<int32_t*>(base + at); };
  // the products take the router's permutation; the combine fuses the next layer's norm (moe_decode's order)
  cuda::moe_route_decode<T>(weights, experts, ints(l.offsets), ints(l.src_token), ints(l.dest_row), in, lw.gate,
                            lw.expert_bias, done, n, d.hidden, d.n_experts, d.top_k, d.norm_topk_prob,
                            d.routed_scaling_factor, stream);
  cuda::moe_experts_decode_fp8_routed<T>(x, norm_out, in, lw.experts_w13_q, lw.experts_w13_s, lw.experts_w2_q,
                                         lw.experts_w2_s, scheme, ints(l.offsets), ints(l.src_token), ints(l.dest_row),
                                         weights, next_norm, eps, n, d.hidden, d.n_experts, d.inter, d.top_k,
                                         base + l.rest, stream);
}

bool moe_fp8_prompt_on_tensor_cores(const cuda::MoeDims& d) { return d.hidden % 128 == 0 && d.inter % 128 == 0; }

int64_t moe_fp8_prompt_scratch_bytes(int64_t n, const cuda::MoeDims& d, int64_t elem_bytes) {
  if (moe_fp8_prompt_on_tensor_cores(d))
    return cuda::moe_experts_fp8_scratch_bytes(n, d.hidden, d.n_experts, d.inter, d.top_k);
  return cuda::moe_experts_decode_scratch_bytes(n, d.hidden, d.n_experts, d.inter, d.top_k, elem_bytes);
}

template <typename T>
void moe_fp8_prompt_rows(float* x, const T* in, const DeviceLayerWeights<T>& lw, Fp8Scheme scheme,
                         const int32_t* experts, const float* weights, int64_t n, const cuda::MoeDims& d,
                         void* scratch, cudaStream_t stream, const uint8_t* in_q, const float* in_s,
                         int64_t in_s_ld, const cuda::NextNorm<T>* next) {
  if (!moe_fp8_prompt_on_tensor_cores(d)) {
    LFM2_CHECK(!next, "moe_fp8_prompt_rows: the next norm is fused on the tensor cores' path only");
    cuda::moe_experts_decode_fp8<T>(x, in, lw.experts_w13_q, lw.experts_w13_s, lw.experts_w2_q, lw.experts_w2_s,
                                    scheme, experts, weights, n, d.hidden, d.n_experts, d.inter, d.top_k, scratch,
                                    stream);
    return;
  }
  // the scales laid out k-block major at upload (cuda_weights.h)
  LFM2_CHECK(lw.experts_w13_st && lw.experts_w2_st, "layer ", lw.il,
             ": the FP8 experts' scales were not laid out for the grouped GEMM at upload");
  cuda::moe_experts_fp8<T>(x, in, lw.experts_w13_q, lw.experts_w13_st, lw.experts_w2_q, lw.experts_w2_st, scheme,
                           experts, weights, n, d.hidden, d.n_experts, d.inter, d.top_k, scratch, stream, in_q, in_s,
                           in_s_ld, next);
}

#define LFM2_MOE_FP8(T)                                                                                           \
  template void moe_fp8_decode_rows<T>(float*, T*, const T*, const DeviceLayerWeights<T>&, Fp8Scheme, const float*, \
                                       const float*, float, int64_t, const cuda::MoeDims&, void*, cudaStream_t);   \
  template void moe_fp8_prompt_rows<T>(float*, const T*, const DeviceLayerWeights<T>&, Fp8Scheme, const int32_t*, \
                                       const float*, int64_t, const cuda::MoeDims&, void*, cudaStream_t,          \
                                       const uint8_t*, const float*, int64_t, const cuda::NextNorm<T>*);
LFM2_MOE_FP8(__nv_bfloat16)
LFM2_MOE_FP8(__half)
#undef LFM2_MOE_FP8

}  // namespace lfm2
