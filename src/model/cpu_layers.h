// The layer loop of SPEC §1 on the CPU, the oracle (HF Lfm2MoeDecoderLayer from the lfm2::cpu
// kernels, fp32 weights and activations, fp32 accumulation, deterministic for any thread count).
// Its CUDA twin, model/cuda_layers.h, runs the same blocks in the same order under the same names;
// there q/k/v and w1/w3 are one product each, the q/k norms and RoPE one kernel, and every residual
// add is fused into the block's last product.
//
// Per layer (x: the residual):
//   y = rmsnorm(x)
//   attention: q, k, v = y Wq^T, y Wk^T, y Wv^T; rope(rmsnorm(q)), rope(rmsnorm(k)); x += attention() Wo^T
//   conv:      bcx = y Win^T; x += short_conv(bcx) Wout^T
//   y = rmsnorm(x)
//   dense: x += (silu(y W1^T) * y W3^T) W2^T
//   MoE:   logits = y Wg^T; route; x += experts(y)
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/cpu_decode_state.h"
#include "model/layer_weights.h"

namespace lfm2 {

class CpuLayers {
 public:
  // How the layers run: plainly (scoring), storing the sequences' state (prefill), or one token per
  // sequence against it (decode, at positions pos; rows flagged in done are not routed to experts).
  struct StepRows {
    enum Kind { kPlain, kPrefill, kDecode } kind = kPlain;
    int64_t first_seq = 0;
    const int64_t* pos = nullptr;  // decode: each row's position
    const float* done = nullptr;   // decode: the finished flags
  };

  CpuLayers(const ModelConfig& cfg, const ModelWeights& w, CpuDecodeState& state, int n_threads);

  // This stage's layers in place on x (n_seq * seq_len rows, sequence-major).
  void run(float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);

 private:
  void layer_forward(size_t li, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void attention_block(size_t li, const float* y, float* out, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void conv_block(size_t li, const float* y, float* out, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void dense_block(const LayerWeights& lw, const float* f, float* out, int64_t n_tokens);
  void moe_block(const LayerWeights& lw, const float* f, float* out, int64_t n_tokens, const float* done);
  // Positions 0..seq_len-1 of every sequence, row-major (n_seq, seq_len).
  int64_t* positions(int64_t n_seq, int64_t seq_len);

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  CpuDecodeState& state_;
  int n_threads_;
  std::vector<float> inv_freq_;  // (hd/2)
  // Scratch, grown on demand and reused by every layer.
  std::vector<float> y_, mix_, q_, k_, v_, o_, attn_scratch_, moe_scratch_;
  std::vector<int32_t> picked_, moe_int_scratch_;
  std::vector<int64_t> pos_;
};

}  // namespace lfm2
