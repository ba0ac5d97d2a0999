// The routed experts of an MoE layer on the GPU, composed from the MoE kernels with everything on
// the device (no host round trip, capturable in a CUDA graph): permutation by expert -> gather of
// the token rows into expert order -> grouped GEMM [w1; w3] -> SwiGLU over the [gate | up] rows ->
// grouped GEMM w2 -> weighted un-permutation added into the residual. (SwiGLU fused into the GEMM's
// epilogue, moe_grouped_swiglu, was measured slower and is not used here: docs/cuda-backend.md.) Scratch is carved from one
// caller-owned buffer of moe_experts_scratch_bytes().
#include <algorithm>

#include "common/align.h"
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

struct Layout {
  int64_t offsets, src_token, dest_row, permute, grouped_ws, gathered, gate_up, act, total;  // byte offsets
};

Layout layout(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, int64_t elem) {
  const int64_t P = n_tokens * top_k;
  Layout l;
  l.offsets = 0;
  l.src_token = l.offsets + align_up((n_experts + 1) * 4);
  l.dest_row = l.src_token + align_up(P * 4);
  l.permute = l.dest_row + align_up(P * 4);
  l.grouped_ws = l.permute + align_up(moe_permute_scratch_ints(n_tokens, n_experts, top_k) * 4);
  l.gathered = l.grouped_ws + align_up(moe_grouped_matmul_workspace_bytes(n_experts));
  l.gate_up = l.gathered + align_up(P * hidden * elem);
  // gate_up (P, 2 inter) is dead after SwiGLU, so the expert outputs (P, hidden) reuse it
  l.act = l.gate_up + align_up(P * std::max(2 * inter, hidden) * elem);
  l.total = l.act + align_up(P * inter * elem);
  return l;
}

}  // namespace

int64_t moe_experts_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                                  int64_t elem_bytes) {
  return layout(n_tokens, hidden, n_experts, inter, top_k, elem_bytes).total;
}

template <typename T>
void moe_experts(float* x, const T* in, const T* w13, const T* w2, const int32_t* experts, const float* weights,
                 int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                 cudaStream_t stream, const NextNorm<T>* next) {
  if (n_tokens == 0) return;
  const Layout l = layout(n_tokens, hidden, n_experts, inter, top_k, sizeof(T));
  char* base = static_cast<char*>(scratch);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  auto* src_token = reinterpret_cast<int32_t*>(base + l.src_token);
  auto* dest_row = reinterpret_cast<int32_t*>(base + l.dest_row);
  auto* perm_scratch = reinterpret_cast<int32_t*>(base + l.permute);
  void* grouped_ws = base + l.grouped_ws;
  auto* gathered = reinterpret_cast<T*>(base + l.gathered);
  auto* gate_up = reinterpret_cast<T*>(base + l.gate_up);
  auto* act = reinterpret_cast<T*>(base + l.act);
  T* expert_out = gate_up;
  const int64_t P = n_tokens * top_k;

  moe_permute(offsets, src_token, dest_row, experts, n_tokens, n_experts, top_k, perm_scratch, stream);
  moe_gather(gathered, in, src_token, P, hidden, stream);
  moe_grouped_matmul(gate_up, gathered, w13, offsets, P, n_experts, hidden, 2 * inter, grouped_ws, stream);
  swiglu(act, gate_up, P, inter, stream);
  moe_grouped_matmul(expert_out, act, w2, offsets, P, n_experts, inter, hidden, grouped_ws, stream);
  if (next)
    moe_combine_norm(x, expert_out, dest_row, weights, n_tokens, top_k, hidden, *next, stream);
  else
    moe_combine(x, expert_out, dest_row, weights, n_tokens, top_k, hidden, stream);
}

#define INST(T)                                                                                                    \
  template void moe_experts<T>(float*, const T*, const T*, const T*, const int32_t*, const float*, int64_t, int64_t, \
                               int64_t, int64_t, int64_t, void*, cudaStream_t, const NextNorm<T>*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
