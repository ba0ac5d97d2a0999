#include "model/cuda_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/cuda/ops.h"
#include "model/cuda_moe_fp8.h"

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
  // e4m3 experts: the prompt rows' FP8 products (cuda_moe_fp8.h)
  const bool fp8 = std::any_of(w_.layers.begin(), w_.layers.end(), [](const auto& l) { return l.experts_w13_q; });
  const cuda::MoeDims dims{H, E, Im, k, cfg_.norm_topk_prob, float(cfg_.routed_scaling_factor)};
  const int64_t o_moe = scratch_.reserve(fp8 ? moe_fp8_prompt_scratch_bytes(N, dims, et)
                                             : cuda::moe_experts_scratch_bytes(N, H, E, Im, k, et));
  const int64_t o_tok = scratch_.reserve(N * 4);
  // e4m3 projections (a --dense FP8 file): their quantized inputs
  const bool fp8_proj = std::any_of(w_.layers.begin(), w_.layers.end(),
                                    [](const auto& l) { return l.qkv_proj_q || l.conv_in_proj_q; });
  const int64_t max_in = std::max({H, nh * hd, I}), max_out = std::max(big_w, H);
  const int64_t o_ps = fp8_proj ? scratch_.reserve(cuda::linear_fp8_scratch_bytes(N, max_in, max_out)) : -1;
  const int64_t o_pw = fp8_proj ? scratch_.reserve(cuda::moe_grouped_matmul_fp8_workspace_bytes(1)) : -1;
  // the norms' e4m3 outputs (16-bit stages, H a multiple of 128: rmsnorm_quantize_e4m3)
  const char* fuse_env = std::getenv("LFM2_FP8_NORM_QUANT");
  const std::string fuse = fuse_env ? fuse_env : "1";
  LFM2_CHECK(fuse == "1" || fuse == "0" || fuse == "proj" || fuse == "moe", "LFM2_FP8_NORM_QUANT=", fuse,
             " (1, 0, proj or moe)");
  const bool fusable = sizeof(T) == 2 && H % 128 == 0 && H <= 8192;
  fuse_proj_ = fusable && fp8_proj && (fuse == "1" || fuse == "proj");
  fuse_moe_ = fusable && fp8 && moe_fp8_prompt_on_tensor_cores(dims) && (fuse == "1" || fuse == "moe");
  const bool fused = fuse_proj_ || fuse_moe_;
  const int64_t o_nq = fused ? scratch_.reserve(N * H) : -1;
  const int64_t o_ns = fused ? scratch_.reserve(N * (H / 128) * 4) : -1;
  scratch_.allocate(cat("scratch for ", N, " tokens"), device);
  y_ = scratch_.at<T>(o_y);
  big_ = scratch_.at<T>(o_big);
  mid_ = scratch_.at<T>(o_mid);
  router_logits_ = scratch_.at<float>(o_logits);
  topk_w_ = scratch_.at<float>(o_w);
  topk_ids_ = scratch_.at<int32_t>(o_ids);
  moe_scratch_ = scratch_.at<char>(o_moe);
  ids_ = scratch_.at<int32_t>(o_tok);
  proj_scratch_ = fp8_proj ? scratch_.at<char>(o_ps) : nullptr;
  // the CUTLASS path's quantized input inside it: (N, max_in) e4m3, (max_in / 128, N) scales, 2 ints
  act_q_ = fp8_proj ? scratch_.at<uint8_t>(o_ps) : nullptr;
  act_s_ = fp8_proj ? scratch_.at<float>(o_ps + DeviceBlocks::aligned(N * max_in)) : nullptr;
  act_offsets_ = fp8_proj ? scratch_.at<int32_t>(o_ps + DeviceBlocks::aligned(N * max_in) +
                                                 DeviceBlocks::aligned(N * (max_in / 128) * 4))
                          : nullptr;
  proj_ws_ = fp8_proj ? scratch_.at<char>(o_pw) : nullptr;
  norm_q_ = fused ? scratch_.at<uint8_t>(o_nq) : nullptr;
  norm_s_ = fused ? scratch_.at<float>(o_ns) : nullptr;
  capacity_ = N;
}

template <typename T>
void CudaLayers<T>::release() {
  if (scratch_.allocated()) cudaStreamSynchronize(stream_);  // queued work may still use it
  scratch_.release();
  capacity_ = 0;
}

template <typename T>
void CudaLayers<T>::run(float* x, int64_t n_seq, int64_t seq_len) {
  const Pass p{n_seq * seq_len, n_seq, seq_len, nullptr};
  Normed normed;  // the operator norm made by the MoE before
  for (size_t li = 0; li < w_.layers.size(); ++li) normed = layer_forward(li, x, p, normed);
}

template <typename T>
void CudaLayers<T>::run_step(float* x, const StepDevice& step) {
  const Pass p{step.rows, 0, 0, &step};
  Normed normed;
  for (size_t li = 0; li < w_.layers.size(); ++li) normed = layer_forward(li, x, p, normed);
}

// Decode rows [0, nd) by the decode products (their bits depend on the shape alone), the rest by
// the pinned ones; the rest on e4m3 where the projection is (a --dense FP8 file, product_fp8).
template <typename T>
void CudaLayers<T>::product(Product kind, void* out, const T* in, Proj w, int64_t n_in, int64_t n_out,
                            const Pass& p, const QuantRows& yq) {
  const T* weight = w.w;
  const int64_t nd = p.n_decode(), np = p.n_tokens - nd;
  const int64_t out_elem = kind == Product::kOut ? int64_t(sizeof(T)) : 4;
  char* rest = static_cast<char*>(out) + nd * n_out * out_elem;
  switch (kind) {
    case Product::kOut:
      if (nd) cuda::linear_decode(static_cast<T*>(out), in, weight, nd, n_in, n_out, stream_, tf32_);
      break;
    case Product::kF32Out:
      if (nd) cuda::linear_f32out_decode(static_cast<float*>(out), in, weight, nd, n_in, n_out, stream_, tf32_);
      break;
    case Product::kAddF32:
      if (nd) cuda::linear_add_f32_decode(static_cast<float*>(out), in, weight, nd, n_in, n_out, stream_, tf32_);
      break;
  }
  if (!np) return;
  if (w.q) return product_fp8(kind, rest, in + nd * n_in, w, np, n_in, n_out, yq);
  switch (kind) {
    case Product::kOut:
      cuda::linear(reinterpret_cast<T*>(rest), in + nd * n_in, weight, np, n_in, n_out, stream_, tf32_);
      break;
    case Product::kF32Out:
      cuda::linear_f32out(reinterpret_cast<float*>(rest), in + nd * n_in, weight, np, n_in, n_out, stream_, tf32_);
      break;
    case Product::kAddF32:
      cuda::linear_add_f32(reinterpret_cast<float*>(rest), in + nd * n_in, weight, np, n_in, n_out, stream_, tf32_);
      break;
  }
}

// n prompt rows on e4m3: quantized per row (channel) or per (row, 128 columns) (block128), the CPU
// oracle's fp8_activations, then cuBLASLt's FP8 matmul (cuda::linear_fp8: a pinned algorithm, row
// counts it refuses padded in scratch; a row's bits are its own).
template <typename T>
void CudaLayers<T>::product_fp8(Product kind, void* out, const T* in, Proj w, int64_t n, int64_t n_in,
                                int64_t n_out, const QuantRows& yq) {
  if constexpr (sizeof(T) != 2) {
    (void)kind, (void)out, (void)in, (void)w, (void)n, (void)n_in, (void)n_out, (void)yq;
    LFM2_FAIL("cuda stage: e4m3 projections need --dtype bf16 or fp16");
  } else {
    const Fp8Scheme scheme = cfg_.fp8.scheme;
    const cuda::LtOut k = kind == Product::kOut      ? cuda::LtOut::kT
                          : kind == Product::kF32Out ? cuda::LtOut::kF32
                                                     : cuda::LtOut::kAddF32;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      if (w.st) {  // the CUTLASS kernel as one group: bf16 out, through big_ when added into x
        LFM2_CHECK(kind != Product::kF32Out, "cuda stage: no fp32 out on the CUTLASS FP8 projections");
        cuda::quantize_rows_fp8_lt(act_q_, act_s_, act_offsets_, in, scheme, n, n_in, stream_);
        T* o = kind == Product::kOut ? static_cast<T*>(out) : big_;
        cuda::moe_grouped_matmul_fp8(o, act_q_, act_s_, w.q, w.st, scheme, act_offsets_, n, 1, n_in, n_out, proj_ws_,
                                     stream_);
        if (kind == Product::kAddF32) cuda::add(static_cast<float*>(out), static_cast<float*>(out), big_, n * n_out,
                                                stream_);
        return;
      }
    }
    if (yq.q)
      cuda::linear_fp8_quantized<T>(out, k, yq.q, yq.s, yq.ld, w.q, w.s, scheme, n, n_in, n_out, proj_scratch_,
                                    stream_);
    else
      cuda::linear_fp8<T>(out, k, in, w.q, w.s, scheme, n, n_in, n_out, proj_scratch_, stream_);
  }
}

// Whether layer li's mixer product takes its prompt rows in e4m3 from the norm before it (the
// CUTLASS projections, w.st, quantize for themselves).
template <typename T>
bool CudaLayers<T>::mixer_takes_e4m3(size_t li) const {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  return fuse_proj_ &&
         (lw.is_attention ? lw.qkv_proj_q && !lw.qkv_proj_st : lw.conv_in_proj_q && !lw.conv_in_proj_st);
}

// x += mixer(operator_norm(x)); x += ffn(ffn_norm(x)): each block adds its output into x itself.
// Returns what the MoE also made of the next layer's operator norm.
template <typename T>
typename CudaLayers<T>::Normed CudaLayers<T>::layer_forward(size_t li, float* x, const Pass& p, const Normed& pre) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  QuantRows yq = pre.q;
  if (pre.rows < p.n_tokens) yq = norm(x, lw.operator_norm, pre.rows, mixer_takes_e4m3(li), p, false);
  if (lw.is_attention)
    attention_block(li, y_, x, p, yq);
  else
    conv_block(li, y_, x, p, yq);

  // fuse_moe_: e4m3 experts on the tensor cores (checked once, at reserve)
  const bool ffn_e4m3 = lw.is_moe ? fuse_moe_ && lw.experts_w13_q : fuse_proj_ && lw.w13_q && !lw.w13_st;
  yq = norm(x, lw.ffn_norm, 0, ffn_e4m3, p, lw.is_moe);  // the router reads the T rows
  if (lw.is_moe) return moe_block(li, y_, x, p, yq);
  dense_block(lw, y_, x, p, yq);
  return {};
}

// One launch either way; the quantized rows are the prompt rows [n_decode, n_tokens) (a prompt row's
// bits: rmsnorm, then the consumer's quantization of its T output).
template <typename T>
typename CudaLayers<T>::QuantRows CudaLayers<T>::norm(float* x, const float* weight, int64_t skip, bool feeds_e4m3,
                                                      const Pass& p, bool prompt_t) {
  const int64_t H = cfg_.hidden_size, nd = p.n_decode(), np = p.n_tokens - nd;
  const float eps = float(cfg_.norm_eps);
  if constexpr (sizeof(T) == 2) {
    if (feeds_e4m3 && np) {
      cuda::rmsnorm_quantize_e4m3(y_ + skip * H, norm_q_, norm_s_, x + skip * H, weight, p.n_tokens - skip,
                                  nd - skip, H, eps, cfg_.fp8.scheme == Fp8Scheme::Channel, stream_, prompt_t);
      return {norm_q_, norm_s_, np};
    }
  }
  cuda::rmsnorm(y_ + skip * H, x + skip * H, weight, p.n_tokens - skip, H, eps, stream_);
  return {};
}

// x += out_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)), HF Lfm2MoeAttention: q, k and v
// from one product (qkv_proj), the norms and RoPE fused (qk_norm_rope). A generation step stores
// every row's k and v in its slot's pages with the norms and RoPE (qk_norm_rope_store), then its
// decode rows attend by flash-decoding, its prompt chunks by the chunked prefill.
template <typename T>
void CudaLayers<T>::attention_block(size_t li, const T* y, float* x, const Pass& p, const QuantRows& yq) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t H = cfg_.hidden_size, hd = cfg_.head_dim();
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, width = (nh + 2 * nkv) * hd;
  const float eps = float(cfg_.norm_eps);
  const float scale = float(std::pow(double(hd), -0.5));  // HF: head_dim**-0.5, applied in fp32
  T* qkv = big_;
  T* o = mid_;
  product(Product::kOut, qkv, y, {lw.qkv_proj, lw.qkv_proj_q, lw.qkv_proj_s, lw.qkv_proj_st}, H, width, p, yq);
  if (!p.step) {
    cuda::qk_norm_rope(qkv, lw.q_layernorm, lw.k_layernorm, w_.rope_inv_freq, p.n_seq, p.seq_len, nh, nkv, hd, eps,
                       stream_);
    cuda::attention(o, qkv, qkv + nh * hd, qkv + (nh + nkv) * hd, p.n_seq, p.seq_len, nh, nkv, hd, scale, stream_,
                    width, width);
  } else if (state_.kv_fp8()) {
    attention_step_fp8(li, qkv, o, *p.step);
  } else {
    const StepDevice& s = *p.step;
    const auto& st = state_.layer(li);
    const StateShape& sh = state_.shape();
    cuda::qk_norm_rope_store(qkv, st.k, st.v, lw.q_layernorm, lw.k_layernorm, w_.rope_inv_freq, s.seqs, s.n_seqs,
                             s.rows, state_.table(), sh.max_pages, sh.page_size, nh, nkv, hd, eps, stream_);
    if (s.n_decode)
      cuda::attention_decode_paged(o, qkv, st.k, st.v, s.seqs, s.n_decode, state_.table(), sh.max_pages, sh.page_size,
                                   nh, nkv, hd, scale, state_.attention_workspace(), stream_, width);
    if (s.n_seqs > s.n_decode)
      cuda::attention_prefill_paged(o, qkv, st.k, st.v, s.seqs + s.n_decode, s.n_seqs - s.n_decode,
                                    s.max_prompt_rows, state_.table(), sh.max_pages, sh.page_size, nh, nkv, hd, scale,
                                    stream_, width);
  }
  product(Product::kAddF32, x, o, {lw.out_proj, lw.out_proj_q, lw.out_proj_s, lw.out_proj_st}, nh * hd, H, p);
}

// A generation step's attention over an fp8 cache (--kv-dtype fp8): the store quantizes each k and v
// head row (paged_kv.h), the attention kernels widen the e4m3 tiles; bf16 / fp16 only (the stage
// refuses fp32 with an fp8 cache).
template <typename T>
void CudaLayers<T>::attention_step_fp8(size_t li, T* qkv, T* o, const StepDevice& s) {
  if constexpr (std::is_same<T, float>::value) {
    (void)li, (void)qkv, (void)o, (void)s;
    LFM2_FAIL("cuda stage: an fp8 KV cache needs --dtype bf16 or fp16");
  } else {
    const DeviceLayerWeights<T>& lw = w_.layers[li];
    const int64_t hd = cfg_.head_dim(), nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
    const int64_t width = (nh + 2 * nkv) * hd;
    const float scale = float(std::pow(double(hd), -0.5));
    const auto& st = state_.layer(li);
    const StateShape& sh = state_.shape();
    cuda::qk_norm_rope_store_fp8(qkv, st.k8, st.v8, st.k_scale, st.v_scale, lw.q_layernorm, lw.k_layernorm,
                                 w_.rope_inv_freq, s.seqs, s.n_seqs, s.rows, state_.table(), sh.max_pages,
                                 sh.page_size, nh, nkv, hd, float(cfg_.norm_eps), stream_);
    if (s.n_decode)
      cuda::attention_decode_paged_fp8(o, qkv, st.k8, st.v8, st.k_scale, st.v_scale, s.seqs, s.n_decode,
                                       state_.table(), sh.max_pages, sh.page_size, nh, nkv, hd, scale,
                                       state_.attention_workspace(), stream_, width);
    if (s.n_seqs > s.n_decode)
      cuda::attention_prefill_paged_fp8(o, qkv, st.k8, st.v8, st.k_scale, st.v_scale, s.seqs + s.n_decode,
                                        s.n_seqs - s.n_decode, s.max_prompt_rows, state_.table(), sh.max_pages,
                                        sh.page_size, nh, nkv, hd, scale, stream_, width);
  }
}

// x += out_proj(C * conv(B * x)), HF Lfm2MoeShortConv. A generation step continues each entry from
// its slot's conv state and leaves there the last inputs of its rows (short_conv_step).
template <typename T>
void CudaLayers<T>::conv_block(size_t li, const T* y, float* x, const Pass& p, const QuantRows& yq) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t H = cfg_.hidden_size, L = cfg_.conv_L_cache;
  T* bcx = big_;
  T* z = mid_;
  product(Product::kOut, bcx, y, {lw.conv_in_proj, lw.conv_in_proj_q, lw.conv_in_proj_s, lw.conv_in_proj_st}, H,
          3 * H, p, yq);
  QuantRows zq;  // a prompt pass's conv output as the out product's e4m3 input, or none
  if (p.step) {
    const StepDevice& s = *p.step;
    const int64_t longest = std::max<int64_t>(s.max_prompt_rows, s.n_decode ? 1 : 0);
    cuda::short_conv_step(z, bcx, lw.conv, state_.layer(li).conv, s.seqs, s.n_seqs, s.ends, s.rows, longest, H, L,
                          stream_);
  } else {
    zq = conv_quantized(li, bcx, p);
    if (!zq.q) cuda::short_conv(z, bcx, lw.conv, p.n_seq, p.seq_len, H, L, stream_);
  }
  product(Product::kAddF32, x, z, {lw.conv_out_proj, lw.conv_out_proj_q, lw.conv_out_proj_s, lw.conv_out_proj_st},
          H, H, p, zq);
}

// A prompt pass's conv output as the e4m3 rows its out projection takes (cuBLASLt's, block128),
// made by the conv's launch into the norm's buffers (the conv in projection has read them): the
// bits quantize_rows_fp8_lt gives short_conv's rows. Null where that product is not so fed.
template <typename T>
typename CudaLayers<T>::QuantRows CudaLayers<T>::conv_quantized(size_t li, const T* bcx, const Pass& p) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  if constexpr (sizeof(T) == 2) {
    if (fuse_proj_ && lw.conv_out_proj_q && !lw.conv_out_proj_st && cfg_.fp8.scheme == Fp8Scheme::Block128 &&
        cfg_.conv_L_cache == 3) {
      cuda::short_conv_quantize_e4m3(norm_q_, norm_s_, bcx, lw.conv, p.n_seq, p.seq_len, cfg_.hidden_size,
                                     cfg_.conv_L_cache, stream_);
      return {norm_q_, norm_s_, p.n_tokens};
    }
  }
  (void)lw, (void)bcx, (void)p;
  return {};
}

// x += w2(silu(w1 f) * w3 f), HF Lfm2MoeMLP: w1 and w3 in one product (w13).
template <typename T>
void CudaLayers<T>::dense_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, const Pass& p,
                                const QuantRows& yq) {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  T* gate_up = big_;
  T* g = mid_;
  product(Product::kOut, gate_up, f, {lw.w13, lw.w13_q, lw.w13_s, lw.w13_st}, H, 2 * I, p, yq);
  cuda::swiglu(g, gate_up, p.n_tokens, I, stream_);
  product(Product::kAddF32, x, g, {lw.w2, lw.w2_q, lw.w2_s, lw.w2_st}, I, H, p);
}

// x += routed experts of f, HF Lfm2MoeSparseMoeBlock. Decode rows: moe_decode, or for e4m3 experts
// cuda_moe_fp8.h's (the rows flagged finished get nothing); the other rows: the router's product,
// moe_router and the CUTLASS experts (for e4m3 experts the FP8 ones, cuda_moe_fp8.h). Both combines
// make the next layer's operator norm into y where there is one (the prompt rows' also its e4m3
// codes where the next mixer takes them: mixer_takes_e4m3).
template <typename T>
typename CudaLayers<T>::Normed CudaLayers<T>::moe_block(size_t li, const T* f, float* x, const Pass& p,
                                                        const QuantRows& yq) {
  const DeviceLayerWeights<T>& lw = w_.layers[li];
  const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
  const int64_t top_k = cfg_.num_experts_per_tok, nd = p.n_decode(), np = p.n_tokens - nd;
  const float* next_norm = li + 1 < w_.layers.size() ? w_.layers[li + 1].operator_norm : nullptr;
  const cuda::MoeDims dims{H, E, Im, top_k, cfg_.norm_topk_prob, float(cfg_.routed_scaling_factor)};
  const bool fp8 = lw.experts_w13_q != nullptr;  // 16-bit stages only (cuda_weights.h)
  if (nd && fp8) {
    if constexpr (sizeof(T) == 2)
      moe_fp8_decode_rows(x, y_, f, lw, cfg_.fp8.scheme, p.step->done, next_norm, float(cfg_.norm_eps), nd, dims,
                          state_.moe_scratch(), stream_);
  }
  if (nd && !fp8)
    cuda::moe_decode(x, y_, f, lw.gate, lw.expert_bias, lw.experts_w13, lw.experts_w2, p.step->done, next_norm,
                     float(cfg_.norm_eps), nd, dims, state_.moe_scratch(), stream_);
  Normed made{nd > 0 && next_norm ? nd : 0, {}};
  if (np) {
    cuda::linear_f32out(router_logits_, f + nd * H, lw.gate, np, H, E, stream_, tf32_);
    cuda::moe_router(topk_w_, topk_ids_, router_logits_, lw.expert_bias, np, E, top_k, cfg_.norm_topk_prob,
                     float(cfg_.routed_scaling_factor), stream_);
    // (FP8 experts: where they run on the tensor cores)
    const bool fuse = next_norm && cuda::moe_combine_norm_fits(H) && (!fp8 || moe_fp8_prompt_on_tensor_cores(dims));
    const bool e4m3 = fuse && mixer_takes_e4m3(li + 1);
    cuda::NextNorm<T> next{next_norm, float(cfg_.norm_eps), e4m3 ? nullptr : y_ + nd * H};
    if (e4m3) next.q = norm_q_, next.scales = norm_s_, next.per_row = cfg_.fp8.scheme == Fp8Scheme::Channel;
    if (fp8) {
      if constexpr (sizeof(T) == 2)
        moe_fp8_prompt_rows(x + nd * H, f + nd * H, lw, cfg_.fp8.scheme, topk_ids_, topk_w_, np, dims, moe_scratch_,
                            stream_, yq.q, yq.s, yq.ld, fuse ? &next : nullptr);
    } else {
      cuda::moe_experts(x + nd * H, f + nd * H, lw.experts_w13, lw.experts_w2, topk_ids_, topk_w_, np, H, E, Im,
                        top_k, moe_scratch_, stream_, fuse ? &next : nullptr);
    }
    // the next norm's rows are [0, n_tokens) only if the decode rows' were made too
    if (fuse && made.rows == nd) made = {p.n_tokens, e4m3 ? QuantRows{norm_q_, norm_s_, np} : QuantRows{}};
  }
  return made;
}

template class CudaLayers<float>;
template class CudaLayers<__nv_bfloat16>;
template class CudaLayers<__half>;

}  // namespace lfm2
