#include "model/cpu_layers.h"

#include <algorithm>
#include <cmath>

#include "common/fp8.h"
#include "io/weight_names.h"
#include "kernels/add.h"
#include "kernels/attention.h"
#include "kernels/attention_paged.h"
#include "kernels/linear.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_router.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/rope_store.h"
#include "kernels/short_conv.h"
#include "kernels/swiglu.h"

namespace lfm2 {
namespace {

float* grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

}  // namespace

CpuLayers::CpuLayers(const ModelConfig& cfg, const ModelWeights& w, CpuDecodeState& state, int n_threads,
                     bool fp8_activations)
    : cfg_(cfg), w_(w), state_(state), n_threads_(n_threads), fp8_act_(fp8_activations && cfg.fp8.on) {
  inv_freq_.resize(size_t(cfg_.head_dim() / 2));
  cpu::rope_inv_freq(inv_freq_.data(), cfg_.head_dim(), cfg_.rope_theta);
}

int64_t CpuLayers::act_group(int64_t cols) const {
  if (!fp8_act_) return 0;
  return cfg_.fp8.scheme == Fp8Scheme::Channel ? cols : kFp8Block;
}

const float* CpuLayers::act(const float* x, int64_t rows, int64_t cols, const char* leaf) {
  if (!fp8_act_ || !is_fp8_leaf(cfg_, leaf)) return x;
  float* a = grow(act_, rows * cols);
  std::copy(x, x + rows * cols, a);
  fp8_fake_quantize_rows(a, rows, cols, act_group(cols));
  return a;
}

void CpuLayers::run(float* x, int64_t n_seq, int64_t seq_len) {
  const Pass p{n_seq * seq_len, n_seq, seq_len, nullptr, nullptr};
  for (size_t li = 0; li < w_.layers.size(); ++li) layer_forward(li, x, p);
}

void CpuLayers::run_step(float* x, const StepLayout& step, const float* done) {
  const Pass p{step.rows, 0, 0, &step, done};
  for (size_t li = 0; li < w_.layers.size(); ++li) layer_forward(li, x, p);
}

// x += sublayer(rmsnorm(x)) over the pass's rows, HF's pre-norm residual; y_ and mix_ hold the
// sublayer's input and output.
template <typename Sublayer>
void CpuLayers::residual(float* x, const std::vector<float>& norm, const Pass& p, const Sublayer& sublayer) {
  const int64_t n_tokens = p.n_tokens, H = cfg_.hidden_size;
  float* y = grow(y_, n_tokens * H);
  float* mix = grow(mix_, n_tokens * H);
  cpu::rmsnorm(y, x, norm.data(), n_tokens, H, float(cfg_.norm_eps), n_threads_);
  sublayer(y, mix);
  cpu::add(x, x, mix, n_tokens * H, n_threads_);
}

// x += mixer(operator_norm(x)); x += ffn(ffn_norm(x)).
void CpuLayers::layer_forward(size_t li, float* x, const Pass& p) {
  const LayerWeights& lw = w_.layers[li];
  residual(x, lw.operator_norm, p, [&](const float* y, float* out) {
    if (lw.is_attention)
      attention_block(li, y, out, p);
    else
      conv_block(li, y, out, p);
  });
  residual(x, lw.ffn_norm, p, [&](const float* y, float* out) {
    if (lw.is_moe)
      moe_block(lw, y, out, p);
    else
      dense_block(lw, y, out, p.n_tokens);
  });
}

// out = out_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)), HF Lfm2MoeAttention. A generation
// step puts q, k and v side by side in rows [q | k | v] for the fused norm + RoPE + store, then
// attends over each slot's pages (its own k and v stored first).
void CpuLayers::attention_block(size_t li, const float* y, float* out, const Pass& p) {
  const LayerWeights& lw = w_.layers[li];
  const int64_t n_tokens = p.n_tokens, H = cfg_.hidden_size, hd = cfg_.head_dim();
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const float eps = float(cfg_.norm_eps);
  float* q = grow(q_, n_tokens * nh * hd);
  float* k = grow(k_, n_tokens * nkv * hd);
  float* v = grow(v_, n_tokens * nkv * hd);
  float* o = grow(o_, n_tokens * nh * hd);
  const float* yq = act(y, n_tokens, H, names::kQProj);  // q, k and v: one input, quantized once
  cpu::linear(q, yq, lw.q_proj.data(), n_tokens, H, nh * hd, n_threads_);
  cpu::linear(k, yq, lw.k_proj.data(), n_tokens, H, nkv * hd, n_threads_);
  cpu::linear(v, yq, lw.v_proj.data(), n_tokens, H, nkv * hd, n_threads_);
  const float scale = float(std::pow(double(hd), -0.5));  // HF: head_dim**-0.5, applied in fp32
  if (!p.step) {
    const int64_t* pos = positions(p.n_seq, p.seq_len);
    cpu::rmsnorm(q, q, lw.q_layernorm.data(), n_tokens * nh, hd, eps, n_threads_);
    cpu::rmsnorm(k, k, lw.k_layernorm.data(), n_tokens * nkv, hd, eps, n_threads_);
    cpu::rope(q, q, pos, inv_freq_.data(), n_tokens, nh, hd, n_threads_);
    cpu::rope(k, k, pos, inv_freq_.data(), n_tokens, nkv, hd, n_threads_);
    float* scratch = grow(attn_scratch_, cpu::attention_scratch_floats(p.seq_len, n_threads_));
    cpu::attention(o, q, k, v, p.n_seq, p.seq_len, nh, nkv, hd, scale, scratch, n_threads_);
  } else {
    const int64_t width = (nh + 2 * nkv) * hd, kv = nkv * hd;
    float* qkv = grow(qkv_, n_tokens * width);
    for (int64_t r = 0; r < n_tokens; ++r) {
      std::copy(q + r * nh * hd, q + (r + 1) * nh * hd, qkv + r * width);
      std::copy(k + r * kv, k + (r + 1) * kv, qkv + r * width + nh * hd);
      std::copy(v + r * kv, v + (r + 1) * kv, qkv + r * width + nh * hd + kv);
    }
    CpuDecodeState::Layer& st = state_.layers[li];
    const StateShape& sh = state_.shape;
    const StepLayout& step = *p.step;
    auto* store = state_.kv_fp8 ? cpu::qk_norm_rope_store_fp8 : cpu::qk_norm_rope_store;
    store(qkv, st.k.data(), st.v.data(), lw.q_layernorm.data(), lw.k_layernorm.data(), inv_freq_.data(),
          step.seqs.data(), step.n_seqs(), n_tokens, state_.table.data(), sh.max_pages, sh.page_size, nh, nkv, hd, eps,
          n_threads_);
    float* scratch = grow(attn_scratch_, cpu::attention_paged_scratch_floats(sh.max_positions(), n_threads_));
    cpu::attention_paged(o, qkv, st.k.data(), st.v.data(), step.seqs.data(), step.n_seqs(), state_.table.data(),
                         sh.max_pages, sh.page_size, nh, nkv, hd, scale, scratch, n_threads_, width);
  }
  cpu::linear(out, act(o, n_tokens, nh * hd, names::kOutProj), lw.out_proj.data(), n_tokens, nh * hd, H, n_threads_);
}

// out = out_proj(C * conv(B * x)), HF Lfm2MoeShortConv. A generation step continues each entry
// from its slot's conv state and leaves there the last inputs of its rows (short_conv_step).
void CpuLayers::conv_block(size_t li, const float* y, float* out, const Pass& p) {
  const LayerWeights& lw = w_.layers[li];
  const int64_t n_tokens = p.n_tokens, H = cfg_.hidden_size, L = cfg_.conv_L_cache;
  float* bcx = grow(q_, n_tokens * 3 * H);
  float* z = grow(o_, n_tokens * H);
  cpu::linear(bcx, act(y, n_tokens, H, names::kConvInProj), lw.conv_in_proj.data(), n_tokens, H, 3 * H, n_threads_);
  if (p.step)
    cpu::short_conv_step(z, bcx, lw.conv.data(), state_.layers[li].conv.data(), p.step->seqs.data(),
                         p.step->n_seqs(), p.step->ends.data(), H, L, n_threads_);
  else
    cpu::short_conv(z, bcx, lw.conv.data(), p.n_seq, p.seq_len, H, L, n_threads_);
  cpu::linear(out, act(z, n_tokens, H, names::kConvOutProj), lw.conv_out_proj.data(), n_tokens, H, H, n_threads_);
}

// out = w2(silu(w1 f) * w3 f), HF Lfm2MoeMLP.
void CpuLayers::dense_block(const LayerWeights& lw, const float* f, float* out, int64_t n_tokens) {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  float* g = grow(q_, n_tokens * I);
  float* u = grow(k_, n_tokens * I);
  const float* fq = act(f, n_tokens, H, names::kW1);
  cpu::linear(g, fq, lw.w1.data(), n_tokens, H, I, n_threads_);
  cpu::linear(u, fq, lw.w3.data(), n_tokens, H, I, n_threads_);
  cpu::swiglu(g, g, u, n_tokens * I, n_threads_);
  cpu::linear(out, act(g, n_tokens, I, names::kW2), lw.w2.data(), n_tokens, I, H, n_threads_);
}

// out = routed experts of f, HF Lfm2MoeSparseMoeBlock; the decode rows flagged in p.done get nothing.
void CpuLayers::moe_block(const LayerWeights& lw, const float* f, float* out, const Pass& p) {
  const int64_t n_tokens = p.n_tokens, H = cfg_.hidden_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
  const int64_t top_k = cfg_.num_experts_per_tok;
  float* logits = grow(q_, n_tokens * E);
  cpu::linear(logits, f, lw.gate.data(), n_tokens, H, E, n_threads_);
  std::vector<float>& rw = v_;
  grow(rw, n_tokens * top_k);
  if (int64_t(picked_.size()) < n_tokens * top_k) picked_.resize(size_t(n_tokens * top_k));
  cpu::moe_router(rw.data(), picked_.data(), logits, lw.expert_bias.empty() ? nullptr : lw.expert_bias.data(),
                  n_tokens, E, top_k, cfg_.norm_topk_prob, float(cfg_.routed_scaling_factor), n_threads_);
  if (p.step && p.done) cpu::moe_drop_rows(picked_.data(), p.done, p.step->n_decode, top_k);
  const auto need = cpu::moe_experts_scratch(n_tokens, H, E, Im, top_k, n_threads_);
  float* fs = grow(moe_scratch_, need.floats);
  if (int64_t(moe_int_scratch_.size()) < need.ints) moe_int_scratch_.resize(size_t(need.ints));
  cpu::moe_experts(out, f, lw.experts_w1.data(), lw.experts_w3.data(), lw.experts_w2.data(), picked_.data(),
                   rw.data(), n_tokens, H, E, Im, top_k, fs, moe_int_scratch_.data(), n_threads_,
                   !fp8_act_ ? 0 : cfg_.fp8.scheme == Fp8Scheme::Channel ? cpu::kFp8PerRow : kFp8Block);
}

int64_t* CpuLayers::positions(int64_t n_seq, int64_t seq_len) {
  pos_.resize(size_t(n_seq * seq_len));
  for (int64_t r = 0; r < n_seq * seq_len; ++r) pos_[size_t(r)] = r % seq_len;
  return pos_.data();
}

}  // namespace lfm2
