// The routed experts of prompt rows on the FP8 tensor cores (grouped_gemm_fp8.h: moe_experts_fp8),
// composed as moe_experts (moe_experts.cu) with everything on the device: permutation by expert ->
// gather into expert order quantized to e4m3 -> FP8 grouped GEMM [w1; w3] (bf16 out) -> SwiGLU
// quantized to e4m3 -> FP8 grouped GEMM w2 (bf16 out) -> weighted un-permutation into the residual.
// The channel scheme's products are the plain kernel's raw sums (moe_grouped_matmul_fp8_raw), its
// scales applied by the SwiGLU's quantization and the combine, which read those outputs anyway.
// Scratch is carved from one caller-owned buffer of moe_experts_fp8_scratch_bytes().
#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets.
struct Layout {
  int64_t offsets, src_token, dest_row, permute, grouped_ws, q_in, s_in, gate_up, q_act, s_act, total;
};

Layout layout(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k) {
  const int64_t P = n_tokens * top_k;
  Layout l;
  l.offsets = 0;
  l.src_token = l.offsets + align_up((n_experts + 1) * 4);
  l.dest_row = l.src_token + align_up(P * 4);
  l.permute = l.dest_row + align_up(P * 4);
  l.grouped_ws = l.permute + align_up(moe_permute_scratch_ints(n_tokens, n_experts, top_k) * 4);
  l.q_in = l.grouped_ws + align_up(moe_grouped_matmul_fp8_workspace_bytes(n_experts));
  l.s_in = l.q_in + align_up(P * hidden);
  l.gate_up = l.s_in + align_up(moe_e4m3_scale_count(P, hidden) * 4);
  // gate_up (P, 2 inter) bf16 is dead after the SwiGLU, so the expert outputs (P, hidden) reuse it
  l.q_act = l.gate_up + align_up(P * std::max(2 * inter, hidden) * 2);
  l.s_act = l.q_act + align_up(P * inter);
  l.total = l.s_act + align_up(moe_e4m3_scale_count(P, inter) * 4);
  return l;
}

bool& channel_plain() {
  static bool on = true;
  return on;
}

}  // namespace

namespace grouped {
void set_fp8_channel_plain(bool on) { channel_plain() = on; }
bool fp8_channel_plain() { return channel_plain(); }
}  // namespace grouped

int64_t moe_experts_fp8_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                      int64_t top_k) {
  return layout(n_tokens, hidden, n_experts, inter, top_k).total;
}

template <typename T>
void moe_experts_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2, const float* s2,
                     Fp8Scheme scheme, const int32_t* experts, const float* weights, int64_t n_tokens, int64_t hidden,
                     int64_t n_experts, int64_t inter, int64_t top_k, void* scratch, cudaStream_t stream,
                     const uint8_t* in_q, const float* in_s, int64_t in_s_ld, const NextNorm<T>* next) {
  if (n_tokens == 0) return;
  LFM2_CHECK(hidden % 128 == 0 && inter % 128 == 0, "moe_experts_fp8: hidden ", hidden, " and inter ", inter,
             " (multiples of 128)");
  const Layout l = layout(n_tokens, hidden, n_experts, inter, top_k);
  char* base = static_cast<char*>(scratch);
  auto ints = [&](int64_t at) { return reinterpret_cast<int32_t*>(base + at); };
  auto floats = [&](int64_t at) { return reinterpret_cast<float*>(base + at); };
  auto bytes = [&](int64_t at) { return reinterpret_cast<uint8_t*>(base + at); };
  int32_t* offsets = ints(l.offsets);
  auto* gate_up = reinterpret_cast<__nv_bfloat16*>(base + l.gate_up);
  __nv_bfloat16* expert_out = gate_up;
  void* ws = base + l.grouped_ws;
  const int64_t P = n_tokens * top_k;
  const bool per_row = scheme == Fp8Scheme::Channel;  // the CPU oracle's activation groups

  moe_permute(offsets, ints(l.src_token), ints(l.dest_row), experts, n_tokens, n_experts, top_k, ints(l.permute),
              stream);
  if (in_q)
    moe_gather_e4m3(bytes(l.q_in), floats(l.s_in), in_q, in_s, in_s_ld, ints(l.src_token), offsets, P, n_experts,
                    hidden, stream);
  else
    moe_quantize_e4m3<T>(bytes(l.q_in), floats(l.s_in), in, ints(l.src_token), offsets, P, n_experts, hidden,
                         per_row, stream);
  if (per_row && channel_plain()) {
    moe_grouped_matmul_fp8_raw(gate_up, bytes(l.q_in), w13, offsets, P, n_experts, hidden, 2 * inter, ws, stream);
    moe_swiglu_quantize_e4m3_scaled(bytes(l.q_act), floats(l.s_act), gate_up, floats(l.s_in), s13, offsets, P,
                                    n_experts, hidden, inter, stream);
    moe_grouped_matmul_fp8_raw(expert_out, bytes(l.q_act), w2, offsets, P, n_experts, inter, hidden, ws, stream);
    moe_combine_fp8_scaled(x, expert_out, ints(l.dest_row), weights, floats(l.s_act), s2, offsets, n_tokens,
                           n_experts, top_k, hidden, inter, stream);
    if (next && next->q)
      rmsnorm_quantize_e4m3(next->out, next->q, next->scales, x, next->weight, n_tokens, 0, hidden, next->eps,
                            next->per_row, stream, next->out != nullptr);
    else if (next)
      rmsnorm(next->out, x, next->weight, n_tokens, hidden, next->eps, stream);
    return;
  }
  moe_grouped_matmul_fp8(gate_up, bytes(l.q_in), floats(l.s_in), w13, s13, scheme, offsets, P, n_experts,
                         hidden, 2 * inter, ws, stream);
  moe_swiglu_quantize_e4m3(bytes(l.q_act), floats(l.s_act), gate_up, offsets, P, n_experts, inter, per_row, stream);
  moe_grouped_matmul_fp8(expert_out, bytes(l.q_act), floats(l.s_act), w2, s2, scheme, offsets, P, n_experts,
                         inter, hidden, ws, stream);
  if (next)
    moe_combine_norm<T, __nv_bfloat16>(x, expert_out, ints(l.dest_row), weights, n_tokens, top_k, hidden, *next,
                                       stream);
  else
    moe_combine<__nv_bfloat16>(x, expert_out, ints(l.dest_row), weights, n_tokens, top_k, hidden, stream);
}

template void moe_experts_fp8<__nv_bfloat16>(float*, const __nv_bfloat16*, const uint8_t*, const float*,
                                             const uint8_t*, const float*, Fp8Scheme, const int32_t*, const float*,
                                             int64_t, int64_t, int64_t, int64_t, int64_t, void*, cudaStream_t,
                                             const uint8_t*, const float*, int64_t, const NextNorm<__nv_bfloat16>*);
template void moe_experts_fp8<__half>(float*, const __half*, const uint8_t*, const float*, const uint8_t*,
                                      const float*, Fp8Scheme, const int32_t*, const float*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t, void*, cudaStream_t, const uint8_t*, const float*,
                                      int64_t, const NextNorm<__half>*);

}  // namespace lfm2::cuda
