#include "model/cuda_layers.h"

#include <algorithm>
#include <cmath>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {

template <typename T>
void CudaLayers<T>::reserve(int64_t max_tokens, int64_t y_rows, int device) {
  if (max_tokens <= capacity_) return;
  release();
  const int64_t N = max_tokens, H = cfg_.hidden_size, hd = cfg_.head_dim();
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const int64_t I = cfg_.intermediate_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
  const int64_t k = cfg_.num_experts_per_tok, et = sizeof(T);
  const int64_t big_w = std::max({(nh + 2 * nkv) * hd, 3 * H, 2 * I});  // qkv, bcx, gate_up
  const int64_t mid_w = std::max({nh * hd, H, I});                      // attention out, conv out, act
  const int64_t o_y = scratch_.reserve(std::max(N, y_rows) * H * et), o_big = scratch_.reserve(N * big_w * et);
  const int64_t o_mid = scratch_.reserve(N * mid_w * et), o_logits = scratch_.reserve(N * E * 4);
  const int64_t o_w = scratch_.reserve(N * k * 4), o_ids = scratch_.reserve(N * k * 4);
  const int64_t o_moe = scratch_.reserve(cuda::moe_experts_scratch_bytes(N, H, E, Im, k, et));
  const int64_t o_tok = scratch_.reserve(N * 4);
  scratch_.allocate(cat("scratch for ", N, " tokens"), device);
  y_ = scratch_.at<T>(o_y);
  big_ = scratch_.at<T>(o_big);
  mid_ = scratch_.at<T>(o_mid);
  router_logits_ = scratch_.at<float>(o_logits);
  topk_w_ = scratch_.at<float>(o_w);
  topk_ids_ = scratch_.at<int32_t>(o_ids);
  moe_scratch_ = scratch_.at<char>(o_moe);
  ids_ = scratch_.at<int32_t>(o_tok);
  capacity_ = N;
}

template <typename T>
void CudaLayers<T>::release() {
  if (scratch_.allocated()) cudaStreamSynchronize(stream_);  // queued work may still use it
  scratch_.release();
  capacity_ = 0;
}

template <typename T>
void CudaLayers<T>::run(float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows) {
  for (size_t li = 0; li < w_.layers.size(); ++li) layer_forward(li, x, n_seq, seq_len, rows);
}

// x += mixer(operator_norm(x)); x += ffn(ffn_norm(x)): each block adds its output into x itself.
template <typename T>
void CudaLayers<T>::layer_forward(size_t li, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t n_tokens = n_seq * seq_len, H = cfg_.hidden_size;
  const float eps = float(cfg_.norm_eps);
  T* y = y_;
  cuda::rmsnorm(y, x, lw.operator_norm, n_tokens, H, eps, stream_);
  if (lw.is_attention)
    attention_block(li, y, x, n_seq, seq_len, rows);
  else
    conv_block(li, y, x, n_seq, seq_len, rows);

  cuda::rmsnorm(y, x, lw.ffn_norm, n_tokens, H, eps, stream_);
  if (lw.is_moe)
    moe_block(lw, y, x, n_tokens, rows.done);
  else
    dense_block(lw, y, x, n_tokens);
}

// x += out_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)), HF Lfm2MoeAttention: q, k and v
// from one product (qkv_proj), the norms and RoPE fused (qk_norm_rope). Prefill also stores every
// position's k and v in the cache; decode writes its own there first and attends over the cache.
template <typename T>
void CudaLayers<T>::attention_block(size_t li, const T* y, float* x, int64_t n_seq, int64_t seq_len,
                                    const StepRows& rows) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t n_tokens = n_seq * seq_len, H = cfg_.hidden_size, hd = cfg_.head_dim();
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, width = (nh + 2 * nkv) * hd;
  const float eps = float(cfg_.norm_eps);
  T* qkv = big_;
  T* o = mid_;
  cuda::linear(qkv, y, lw.qkv_proj, n_tokens, H, width, stream_, tf32_);
  cuda::qk_norm_rope(qkv, lw.q_layernorm, lw.k_layernorm, w_.rope_inv_freq, n_seq, seq_len, nh, nkv, hd, eps, stream_,
                     state_.lengths(), rows.first_seq, rows.step, rows.at);
  const float scale = float(std::pow(double(hd), -0.5));  // HF: head_dim**-0.5, applied in fp32
  if (rows.kind != StepRows::kPlain) {
    const auto& st = state_.layer(li);
    cuda::kv_cache_store(st.k, st.v, qkv, n_tokens, seq_len, nh, nkv, hd, state_.lengths(), rows.first_seq, rows.step,
                         state_.max_len(), stream_, rows.at);
  }
  if (rows.kind == StepRows::kDecode) {
    const auto& st = state_.layer(li);
    cuda::attention_decode(o, qkv, st.k, st.v, n_tokens, nh, nkv, hd, scale, state_.lengths(), rows.first_seq,
                           rows.step, state_.max_len(), stream_, rows.at);
  } else {
    cuda::attention(o, qkv, qkv + nh * hd, qkv + (nh + nkv) * hd, n_seq, seq_len, nh, nkv, hd, scale, stream_, width,
                    width);
  }
  cuda::linear_add_f32(x, o, lw.out_proj, n_tokens, nh * hd, H, stream_, tf32_);
}

// x += out_proj(C * conv(B * x)), HF Lfm2MoeShortConv. Prefill also keeps each sequence's last
// conv inputs (at the end of its own prompt); decode convolves with them and shifts them.
template <typename T>
void CudaLayers<T>::conv_block(size_t li, const T* y, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t n_tokens = n_seq * seq_len, H = cfg_.hidden_size, L = cfg_.conv_L_cache;
  T* bcx = big_;
  T* z = mid_;
  cuda::linear(bcx, y, lw.conv_in_proj, n_tokens, H, 3 * H, stream_, tf32_);
  if (rows.kind == StepRows::kDecode) {
    cuda::short_conv_decode(z, bcx, lw.conv, state_.layer(li).conv, state_.lengths(), rows.first_seq, rows.step,
                            rows.at, n_tokens, H, L, stream_);
  } else {
    cuda::short_conv(z, bcx, lw.conv, n_seq, seq_len, H, L, stream_);
  }
  if (rows.kind == StepRows::kPrefill)
    cuda::short_conv_state(state_.layer(li).conv, bcx, state_.lengths(), rows.first_seq, n_seq, seq_len, H, L,
                           stream_);
  cuda::linear_add_f32(x, z, lw.conv_out_proj, n_tokens, H, H, stream_, tf32_);
}

// x += w2(silu(w1 f) * w3 f), HF Lfm2MoeMLP: w1 and w3 in one product (w13).
template <typename T>
void CudaLayers<T>::dense_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, int64_t n_tokens) {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  T* gate_up = big_;
  T* g = mid_;
  cuda::linear(gate_up, f, lw.w13, n_tokens, H, 2 * I, stream_, tf32_);
  cuda::swiglu(g, gate_up, n_tokens, I, stream_);
  cuda::linear_add_f32(x, g, lw.w2, n_tokens, I, H, stream_, tf32_);
}

// x += routed experts of f, HF Lfm2MoeSparseMoeBlock; rows flagged in done (or none) get nothing.
template <typename T>
void CudaLayers<T>::moe_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, int64_t n_tokens,
                              const float* done) {
  const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
  const int64_t top_k = cfg_.num_experts_per_tok;
  float* logits = router_logits_;
  cuda::linear_f32out(logits, f, lw.gate, n_tokens, H, E, stream_, tf32_);
  cuda::moe_router(topk_w_, topk_ids_, logits, lw.expert_bias, n_tokens, E, top_k, cfg_.norm_topk_prob,
                   float(cfg_.routed_scaling_factor), stream_);
  if (done) cuda::moe_drop_rows(topk_ids_, done, n_tokens, top_k, stream_);
  cuda::moe_experts(x, f, lw.experts_w13, lw.experts_w2, topk_ids_, topk_w_, n_tokens, H, E, Im, top_k, moe_scratch_,
                    stream_);
}

template class CudaLayers<float>;
template class CudaLayers<__nv_bfloat16>;
template class CudaLayers<__half>;

}  // namespace lfm2
