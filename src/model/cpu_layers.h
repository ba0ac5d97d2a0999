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
// A generation step (run_step) reads and extends each entry's slot: the q/k norms, RoPE and the
// store of k and v into the slot's pages in one op (qk_norm_rope_store), attention over the pages
// (attention_paged), the conv continuing from the slot's conv state (short_conv_step). Every op here
// works per row, so a row's bits depend on its sequence alone; they equal scoring's for a prompt.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/cpu_decode_state.h"
#include "model/layer_weights.h"
#include "model/step_layout.h"

namespace lfm2 {

// FP8 files (docs/fp8.md): the weights arrive dequantized (layer_weights.h), which is the
// weights-only oracle; with fp8_activations the input of every quantized product is also FP8-quantized
// on the fly (per token for the channel scheme, per 128-column group for block128), the oracle of
// an FP8 x FP8 product.
class CpuLayers {
 public:
  CpuLayers(const ModelConfig& cfg, const ModelWeights& w, CpuDecodeState& state, int n_threads,
            bool fp8_activations = false);

  // This stage's layers in place on x (n_seq * seq_len rows, sequence-major): scoring, no state.
  void run(float* x, int64_t n_seq, int64_t seq_len);
  // A generation step (step.rows rows): each entry reads and extends its slot's state (the KV pages
  // of its positions, the conv state); the decode rows flagged in done (n_decode floats, or null)
  // are not routed to the experts.
  void run_step(float* x, const StepLayout& step, const float* done);

 private:
  // What a pass carries: n_seq plain sequences of seq_len rows, or a generation step.
  struct Pass {
    int64_t n_tokens = 0, n_seq = 0, seq_len = 0;
    const StepLayout* step = nullptr;
    const float* done = nullptr;
  };

  void layer_forward(size_t li, float* x, const Pass& p);
  template <typename Sublayer>
  void residual(float* x, const std::vector<float>& norm, const Pass& p, const Sublayer& sublayer);
  void attention_block(size_t li, const float* y, float* out, const Pass& p);
  void conv_block(size_t li, const float* y, float* out, const Pass& p);
  void dense_block(const LayerWeights& lw, const float* f, float* out, int64_t n_tokens);
  void moe_block(const LayerWeights& lw, const float* f, float* out, const Pass& p);
  // The input of a product with matrix `leaf`: x itself, or its FP8-quantized copy (fp8_activations).
  const float* act(const float* x, int64_t rows, int64_t cols, const char* leaf);
  int64_t act_group(int64_t cols) const;  // 0: none
  // Positions 0..seq_len-1 of every sequence, row-major (n_seq, seq_len).
  int64_t* positions(int64_t n_seq, int64_t seq_len);

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  CpuDecodeState& state_;
  int n_threads_;
  bool fp8_act_;
  std::vector<float> inv_freq_;  // (hd/2)
  // Scratch, grown on demand and reused by every layer.
  std::vector<float> y_, mix_, q_, k_, v_, o_, qkv_, attn_scratch_, moe_scratch_, act_;
  std::vector<int32_t> picked_, moe_int_scratch_;
  std::vector<int64_t> pos_;
};

}  // namespace lfm2
