// The routed experts of prompt rows on the FP8 tensor cores (grouped_gemm_fp8.h: moe_experts_fp8),
// composed as moe_experts (moe_experts.cu) with everything on the device: permutation by expert ->
// gather into expert order quantized to e4m3 -> FP8 grouped GEMM [w1; w3] (bf16 out) -> SwiGLU
// quantized to e4m3 -> FP8 grouped GEMM w2 (bf16 out) -> weighted un-permutation into the residual.
// The channel scheme's products are the plain kernel's raw sums (moe_grouped_matmul_fp8_raw), its
// scales applied by the SwiGLU's quantization and the combine, which read those outputs anyway.
// Block128's rows are padded per expert (moe_pad_rows) so that each product is one GEMM, and gate/up's
// epilogue writes the SwiGLU's e4m3 codes itself (moe_grouped_matmul_fp8_padded_swiglu).
// Scratch is carved from one caller-owned buffer of moe_experts_fp8_scratch_bytes().
#include <algorithm>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

// Byte offsets. The rows of the products' inputs and outputs: the pairs' (P), or the padded rows'
// (m_pad >= P) of the padded product.
struct Layout {
  int64_t offsets, src_token, dest_row, permute, src_pad, dest_pad, tiles, one_group, used_rows, grouped_ws, q_in, s_in,
      gate_up, q_act, s_act, total;
};

Layout layout(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k) {
  const int64_t P = n_tokens * top_k, R = moe_padded_rows(P, n_experts);
  Layout l;
  l.offsets = 0;
  l.src_token = l.offsets + align_up((n_experts + 1) * 4);
  l.dest_row = l.src_token + align_up(P * 4);
  l.permute = l.dest_row + align_up(P * 4);
  l.src_pad = l.permute + align_up(moe_permute_scratch_ints(n_tokens, n_experts, top_k) * 4);
  l.dest_pad = l.src_pad + align_up(R * 4);
  l.tiles = l.dest_pad + align_up(P * 4);
  l.one_group = l.tiles + align_up(R / 128 * 4);
  l.used_rows = l.one_group + align_up(2 * 4);
  l.grouped_ws = l.used_rows + align_up(4);
  l.q_in = l.grouped_ws + align_up(moe_grouped_matmul_fp8_workspace_bytes(n_experts));
  l.s_in = l.q_in + align_up(R * hidden);
  l.gate_up = l.s_in + align_up(moe_e4m3_scale_count(R, hidden) * 4);
  // gate_up (R, 2 inter) bf16 is dead after the SwiGLU, so the expert outputs (R, hidden) reuse it
  l.q_act = l.gate_up + align_up(R * std::max(2 * inter, hidden) * 2);
  l.s_act = l.q_act + align_up(R * inter);
  l.total = l.s_act + align_up(moe_e4m3_scale_count(R, inter) * 4);
  return l;
}

bool& channel_plain() {
  static bool on = true;
  return on;
}

bool& block_padded() {
  static bool on = true;
  return on;
}

bool& swiglu_fused() {
  static bool on = true;
  return on;
}

}  // namespace

namespace grouped {
void set_fp8_channel_plain(bool on) { channel_plain() = on; }
bool fp8_channel_plain() { return channel_plain(); }
void set_fp8_block_padded(bool on) { block_padded() = on; }
bool fp8_block_padded() { return block_padded(); }
void set_fp8_swiglu_fused(bool on) { swiglu_fused() = on; }
bool fp8_swiglu_fused() { return swiglu_fused(); }
}  // namespace grouped

int64_t moe_experts_fp8_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                      int64_t top_k) {
  return layout(n_tokens, hidden, n_experts, inter, top_k).total;
}

namespace {

// One call's operands and scratch, for the three paths below.
template <typename T>
struct Call {
  float* x;
  const T* in;
  const uint8_t *w13, *w2;
  const float *s13, *s2;
  const float* weights;
  int64_t n_tokens, hidden, n_experts, inter, top_k;
  const uint8_t* in_q;
  const float* in_s;
  int64_t in_s_ld;
  const NextNorm<T>* next;
  Layout l;
  char* base;
  cudaStream_t stream;

  int64_t pairs() const { return n_tokens * top_k; }
  int32_t* ints(int64_t at) const { return reinterpret_cast<int32_t*>(base + at); }
  float* floats(int64_t at) const { return reinterpret_cast<float*>(base + at); }
  uint8_t* bytes(int64_t at) const { return reinterpret_cast<uint8_t*>(base + at); }
  __nv_bfloat16* gate_up() const { return reinterpret_cast<__nv_bfloat16*>(base + l.gate_up); }
  __nv_bfloat16* expert_out() const { return gate_up(); }  // gate_up is dead after the SwiGLU
  void* ws() const { return base + l.grouped_ws; }

  // gate/up's input: rows `src` (n_rows of them, grouped by `offsets`) in e4m3
  void quantize_input(const int32_t* src, const int32_t* offsets, int64_t n_rows, int64_t groups, bool per_row) const {
    if (in_q)
      moe_gather_e4m3(bytes(l.q_in), floats(l.s_in), in_q, in_s, in_s_ld, src, offsets, n_rows, groups, hidden, stream);
    else
      moe_quantize_e4m3<T>(bytes(l.q_in), floats(l.s_in), in, src, offsets, n_rows, groups, hidden, per_row, stream);
  }
  // the bf16 expert outputs (rows by dest_row) weighted into x, the next norm in the same launch
  void combine(const int32_t* dest_row) const {
    if (next)
      moe_combine_norm<T, __nv_bfloat16>(x, expert_out(), dest_row, weights, n_tokens, top_k, hidden, *next, stream);
    else
      moe_combine<__nv_bfloat16>(x, expert_out(), dest_row, weights, n_tokens, top_k, hidden, stream);
  }
};

// Channel on the plain kernel: raw sums, the scales applied by the SwiGLU's quantization and the
// combine; the next norm after it.
template <typename T>
void channel_plain_path(const Call<T>& c) {
  const int32_t* offsets = c.ints(c.l.offsets);
  const int64_t P = c.pairs(), E = c.n_experts;
  c.quantize_input(c.ints(c.l.src_token), offsets, P, E, true);
  moe_grouped_matmul_fp8_raw(c.gate_up(), c.bytes(c.l.q_in), c.w13, offsets, P, E, c.hidden, 2 * c.inter, c.ws(),
                             c.stream);
  moe_swiglu_quantize_e4m3_scaled(c.bytes(c.l.q_act), c.floats(c.l.s_act), c.gate_up(), c.floats(c.l.s_in), c.s13,
                                  offsets, P, E, c.hidden, c.inter, c.stream);
  moe_grouped_matmul_fp8_raw(c.expert_out(), c.bytes(c.l.q_act), c.w2, offsets, P, E, c.inter, c.hidden, c.ws(),
                             c.stream);
  moe_combine_fp8_scaled(c.x, c.expert_out(), c.ints(c.l.dest_row), c.weights, c.floats(c.l.s_act), c.s2, offsets,
                         c.n_tokens, E, c.top_k, c.hidden, c.inter, c.stream);
  const NextNorm<T>* next = c.next;
  if (next && next->q)
    rmsnorm_quantize_e4m3(next->out, next->q, next->scales, c.x, next->weight, c.n_tokens, 0, c.hidden, next->eps,
                          next->per_row, c.stream, next->out != nullptr);
  else if (next)
    rmsnorm(next->out, c.x, next->weight, c.n_tokens, c.hidden, next->eps, c.stream);
}

// Block128 on rows padded per expert: one GEMM a product (moe_grouped_matmul_fp8_padded).
template <typename T>
void block_padded_path(const Call<T>& c) {
  const int64_t P = c.pairs(), E = c.n_experts, R = moe_padded_rows(P, E);
  int32_t *src_pad = c.ints(c.l.src_pad), *dest_pad = c.ints(c.l.dest_pad), *tiles = c.ints(c.l.tiles),
          *one = c.ints(c.l.one_group), *used = c.ints(c.l.used_rows);
  moe_pad_rows(src_pad, dest_pad, tiles, one, used, c.ints(c.l.offsets), c.ints(c.l.src_token), c.ints(c.l.dest_row),
               P, E, R, c.stream);
  c.quantize_input(src_pad, one, R, 1, false);
  if (swiglu_fused() && moe_padded_swiglu_fits(c.inter)) {  // the SwiGLU in gate/up's epilogue
    moe_grouped_matmul_fp8_padded_swiglu(c.bytes(c.l.q_act), c.floats(c.l.s_act), c.bytes(c.l.q_in),
                                         c.floats(c.l.s_in), c.w13, c.s13, tiles, used, R, E, c.hidden, c.inter,
                                         c.ws(), c.stream);
  } else {
    moe_grouped_matmul_fp8_padded(c.gate_up(), c.bytes(c.l.q_in), c.floats(c.l.s_in), c.w13, c.s13, tiles, used, R,
                                  E, c.hidden, 2 * c.inter, c.ws(), c.stream);
    // the padding rows (past *used: not written by the product) get zero codes without being read
    moe_swiglu_quantize_e4m3(c.bytes(c.l.q_act), c.floats(c.l.s_act), c.gate_up(), src_pad, one, R, 1, c.inter,
                             false, c.stream);
  }
  moe_grouped_matmul_fp8_padded(c.expert_out(), c.bytes(c.l.q_act), c.floats(c.l.s_act), c.w2, c.s2, tiles, used, R,
                                E, c.inter, c.hidden, c.ws(), c.stream);
  c.combine(dest_pad);
}

// Either scheme on CUTLASS's grouped blockwise kernel (the channel's scales repeated per k block).
template <typename T>
void grouped_path(const Call<T>& c, Fp8Scheme scheme) {
  const int32_t* offsets = c.ints(c.l.offsets);
  const int64_t P = c.pairs(), E = c.n_experts;
  const bool per_row = scheme == Fp8Scheme::Channel;
  c.quantize_input(c.ints(c.l.src_token), offsets, P, E, per_row);
  moe_grouped_matmul_fp8(c.gate_up(), c.bytes(c.l.q_in), c.floats(c.l.s_in), c.w13, c.s13, scheme, offsets, P, E,
                         c.hidden, 2 * c.inter, c.ws(), c.stream);
  moe_swiglu_quantize_e4m3(c.bytes(c.l.q_act), c.floats(c.l.s_act), c.gate_up(), nullptr, offsets, P, E, c.inter,
                           per_row, c.stream);
  moe_grouped_matmul_fp8(c.expert_out(), c.bytes(c.l.q_act), c.floats(c.l.s_act), c.w2, c.s2, scheme, offsets, P, E,
                         c.inter, c.hidden, c.ws(), c.stream);
  c.combine(c.ints(c.l.dest_row));
}

}  // namespace

template <typename T>
void moe_experts_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2, const float* s2,
                     Fp8Scheme scheme, const int32_t* experts, const float* weights, int64_t n_tokens, int64_t hidden,
                     int64_t n_experts, int64_t inter, int64_t top_k, void* scratch, cudaStream_t stream,
                     const uint8_t* in_q, const float* in_s, int64_t in_s_ld, const NextNorm<T>* next) {
  if (n_tokens == 0) return;
  LFM2_CHECK(hidden % 128 == 0 && inter % 128 == 0, "moe_experts_fp8: hidden ", hidden, " and inter ", inter,
             " (multiples of 128)");
  const Call<T> c{x,     in,   w13,  w2,      s13,  s2,
                  weights, n_tokens, hidden, n_experts, inter, top_k,
                  in_q,  in_s, in_s_ld, next, layout(n_tokens, hidden, n_experts, inter, top_k),
                  static_cast<char*>(scratch), stream};
  moe_permute(c.ints(c.l.offsets), c.ints(c.l.src_token), c.ints(c.l.dest_row), experts, n_tokens, n_experts, top_k,
              c.ints(c.l.permute), stream);
  if (scheme == Fp8Scheme::Channel && channel_plain())
    channel_plain_path(c);
  else if (scheme == Fp8Scheme::Block128 && block_padded())
    block_padded_path(c);
  else
    grouped_path(c, scheme);
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
