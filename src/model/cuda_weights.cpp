// The upload runs twice over the same list of blocks (for_each_block): once to reserve each
// block's place in the allocation, once, after the upload, to point the members at their places.
#include "model/cuda_weights.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "common/env.h"
#include "common/error.h"
#include "io/weight_names.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/rope.h"
#include "model/weight_upload.h"

namespace lfm2 {
namespace {

using Leaves = std::initializer_list<const char*>;

// The scale datasets of the e4m3 experts (docs/fp8.md).
const std::string kExpertsW1Scale = fp8_scale_leaf(names::kExpertsW1);
const std::string kExpertsW3Scale = fp8_scale_leaf(names::kExpertsW3);
const std::string kExpertsW2Scale = fp8_scale_leaf(names::kExpertsW2);

// The scale datasets of a --dense file's projections.
std::string sc(const char* leaf) { return fp8_scale_leaf(leaf); }

// Calls f(member, leaves, interleave) for each device block of layer il in upload order: the
// member to point at the block, the datasets stacked into it (interleave: row by row, see
// WeightUploader::reserve). fp8_experts: the experts as stored (e4m3) and their scales; fp8_proj
// the same for the attention, conv and dense projections, beside their dequantized T copy (their
// scales here under channel only: block128's are laid out for cuBLASLt apart, DeviceWeights::upload).
template <typename T, typename F>
void for_each_block(const ModelConfig& cfg, bool has_expert_bias, bool fp8_experts, bool fp8_proj,
                    DeviceLayerWeights<T>& d, F&& f) {
  using namespace names;
  const bool proj_scales = fp8_proj && cfg.fp8.scheme == Fp8Scheme::Channel;
  static const std::string q_s = sc(kQProj), k_s = sc(kKProj), v_s = sc(kVProj), o_s = sc(kOutProj);
  static const std::string ci_s = sc(kConvInProj), co_s = sc(kConvOutProj), w1_s = sc(kW1), w3_s = sc(kW3),
                           w2_s = sc(kW2);
  f(d.operator_norm, Leaves{kOperatorNorm}, false);
  f(d.ffn_norm, Leaves{kFfnNorm}, false);
  if (cfg.is_attention(d.il)) {
    f(d.qkv_proj, Leaves{kQProj, kKProj, kVProj}, false);
    if (fp8_proj) {
      f(d.qkv_proj_q, Leaves{kQProj, kKProj, kVProj}, false);
      if (proj_scales) f(d.qkv_proj_s, Leaves{q_s.c_str(), k_s.c_str(), v_s.c_str()}, false);
    }
    f(d.q_layernorm, Leaves{kQLayernorm}, false);
    f(d.k_layernorm, Leaves{kKLayernorm}, false);
    f(d.out_proj, Leaves{kOutProj}, false);
    if (fp8_proj) {
      f(d.out_proj_q, Leaves{kOutProj}, false);
      if (proj_scales) f(d.out_proj_s, Leaves{o_s.c_str()}, false);
    }
  } else {
    f(d.conv, Leaves{kConv}, false);
    f(d.conv_in_proj, Leaves{kConvInProj}, false);
    f(d.conv_out_proj, Leaves{kConvOutProj}, false);
    if (fp8_proj) {
      f(d.conv_in_proj_q, Leaves{kConvInProj}, false);
      if (proj_scales) f(d.conv_in_proj_s, Leaves{ci_s.c_str()}, false);
      f(d.conv_out_proj_q, Leaves{kConvOutProj}, false);
      if (proj_scales) f(d.conv_out_proj_s, Leaves{co_s.c_str()}, false);
    }
  }
  if (cfg.is_moe(d.il)) {
    f(d.gate, Leaves{kGate}, false);
    if (has_expert_bias) f(d.expert_bias, Leaves{kExpertBias}, false);
    if (fp8_experts) {
      f(d.experts_w13_q, Leaves{kExpertsW1, kExpertsW3}, true);
      f(d.experts_w13_s, Leaves{kExpertsW1Scale.c_str(), kExpertsW3Scale.c_str()}, true);
      f(d.experts_w2_q, Leaves{kExpertsW2}, false);
      f(d.experts_w2_s, Leaves{kExpertsW2Scale.c_str()}, false);
    } else {
      f(d.experts_w13, Leaves{kExpertsW1, kExpertsW3}, true);
      f(d.experts_w2, Leaves{kExpertsW2}, false);
    }
  } else {
    f(d.w13, Leaves{kW1, kW3}, false);
    f(d.w2, Leaves{kW2}, false);
    if (fp8_proj) {
      f(d.w13_q, Leaves{kW1, kW3}, false);
      if (proj_scales) f(d.w13_s, Leaves{w1_s.c_str(), w3_s.c_str()}, false);
      f(d.w2_q, Leaves{kW2}, false);
      if (proj_scales) f(d.w2_s, Leaves{w2_s.c_str()}, false);
    }
  }
}

// The element type a member points to: float (fp32 blocks), uint8_t (e4m3) or T.
template <typename P>
using Pointee = std::remove_const_t<std::remove_pointer_t<std::remove_reference_t<P>>>;

// Calls f(leaves, s, st) for each stacked projection of layer d that a --dense file keeps in e4m3:
// the mixer's in and out products, then a dense layer's w13 and w2; s and st are the members for
// its block scales as cuBLASLt reads them (block128) and k-block major (the CUTLASS path).
template <typename T, typename F>
void for_each_projection(DeviceLayerWeights<T>& d, F&& f) {
  using namespace names;
  if (d.is_attention) {
    f(Leaves{kQProj, kKProj, kVProj}, d.qkv_proj_s, d.qkv_proj_st);
    f(Leaves{kOutProj}, d.out_proj_s, d.out_proj_st);
  } else {
    f(Leaves{kConvInProj}, d.conv_in_proj_s, d.conv_in_proj_st);
    f(Leaves{kConvOutProj}, d.conv_out_proj_s, d.conv_out_proj_st);
  }
  if (!d.is_moe) {
    f(Leaves{kW1, kW3}, d.w13_s, d.w13_st);
    f(Leaves{kW2}, d.w2_s, d.w2_st);
  }
}

std::vector<std::string> layer_paths(int il, Leaves leaves) {
  std::vector<std::string> paths;
  for (const char* leaf : leaves) paths.push_back(layer_path(il, leaf));
  return paths;
}

}  // namespace

bool fp8_projections_on_device(const ModelConfig& cfg, size_t elem_bytes) {
  const bool off = env_choice("LFM2_FP8_PROJ", "1", {"0", "1"}) == "0";
  if (!cfg.fp8.on || !cfg.fp8.projections || elem_bytes != 2 || off) return false;
  // every product's n_in (the activations' 128-column groups); block128 also every stacked part's rows
  const int64_t hd = cfg.head_dim(), kv = cfg.fp8.scheme == Fp8Scheme::Block128 ? cfg.num_key_value_heads * hd : 128;
  for (int64_t n : {cfg.hidden_size, cfg.num_attention_heads * hd, kv, cfg.intermediate_size})
    if (n <= 0 || n % kFp8Block != 0) return false;
  return true;
}

bool fp8_projections_on_cutlass() {
  return env_choice("LFM2_FP8_PROJ_GEMM", "cublaslt", {"cublaslt", "cutlass"}) == "cutlass";
}

template <typename T>
void DeviceWeights<T>::upload(WeightReader& reader, const StageLayers& stage, int device) {
  const ModelConfig& cfg = reader.config();
  const int il0 = stage.layer_begin, il1 = stage.layer_end;
  WeightUploader up(reader, stage_tensor_specs(cfg, stage), device);
  const bool fp8_experts = cfg.fp8.on && sizeof(T) == 2;  // the e4m3 products take 16-bit activations
  const bool fp8_proj = fp8_projections_on_device(cfg, sizeof(T));
  layers.assign(size_t(il1 - il0), DeviceLayerWeights<T>{});
  std::vector<bool> has_bias;
  std::vector<int64_t> offsets;  // of every layer block, in for_each_block order
  for (int il = il0; il < il1; ++il) {
    DeviceLayerWeights<T>& d = layers[size_t(il - il0)];
    d.il = il;
    d.is_attention = cfg.is_attention(il);
    d.is_moe = cfg.is_moe(il);
    has_bias.push_back(d.is_moe && up.has(layer_path(il, names::kExpertBias)));
    for_each_block(cfg, has_bias.back(), fp8_experts, fp8_proj, d, [&](auto& member, Leaves leaves, bool interleave) {
      offsets.push_back(up.reserve(layer_paths(il, leaves), dtype_of<Pointee<decltype(member)>>(), interleave));
    });
  }
  // The prompt rows' FP8 grouped GEMM reads the scales k-block major: laid out here, once.
  const bool scales_kn =
      fp8_experts && cfg.hidden_size % kFp8Block == 0 && cfg.moe_intermediate_size % kFp8Block == 0;
  std::vector<std::pair<int64_t, int64_t>> off_kn(layers.size(), {-1, -1});  // w13's, w2's
  for (size_t li = 0; li < layers.size() && scales_kn; ++li)
    if (layers[li].is_moe)
      off_kn[li] = {up.reserve_scales_kn(layer_paths(layers[li].il, {names::kExpertsW1, names::kExpertsW3})),
                    up.reserve_scales_kn(layer_paths(layers[li].il, {names::kExpertsW2}))};
  // block128 e4m3 projections: their block scales as cuBLASLt's BLK128x128 reads them (rows of k
  // blocks padded, cuda/linear_fp8_lt.h), the stacked parts' block rows one after the other;
  // LFM2_FP8_PROJ_GEMM=cutlass: the projections' scales k-block major too (their stacked members' order)
  const bool proj_pad = fp8_proj && cfg.fp8.scheme == Fp8Scheme::Block128;
  const bool proj_kn = fp8_proj && fp8_projections_on_cutlass() &&
                       (cfg.num_key_value_heads * cfg.head_dim()) % kFp8Block == 0;
  std::vector<int64_t> off_pad, off_pkn;  // in for_each_projection order, layer after layer
  for (DeviceLayerWeights<T>& d : layers)
    for_each_projection(d, [&](Leaves leaves, auto&, auto&) {
      const std::vector<std::string> paths = layer_paths(d.il, leaves);
      if (proj_pad) off_pad.push_back(up.reserve_block_scales_padded(paths, cuda::kFp8LtScaleColumns));
      if (proj_kn) off_pkn.push_back(up.reserve_scales_kn(paths));
    });
  tied_ = cfg.tie_word_embeddings;
  int64_t off_embed = -1, off_norm = -1, off_head = -1;
  if (stage.is_first() || (stage.is_last() && tied_)) off_embed = up.reserve(names::kEmbedTokens, dtype_of<T>());
  if (stage.is_last()) {
    off_norm = up.reserve(names::kEmbeddingNorm, DType::F32);
    if (!tied_) off_head = up.reserve(names::kLmHead, dtype_of<T>());
  }
  std::vector<float> inv_freq(size_t(std::max<int64_t>(cfg.head_dim() / 2, 1)));
  cpu::rope_inv_freq(inv_freq.data(), cfg.head_dim(), cfg.rope_theta);
  const int64_t off_inv_freq = up.reserve_host(inv_freq);

  memory_.reserve(up.total_bytes());
  memory_.allocate("the stage's weights", device);
  up.upload(memory_.base(), cat("uploading ", il1 - il0, " layers to GPU ", device));

  auto at = [&](auto& member, int64_t offset) { member = memory_.at<Pointee<decltype(member)>>(offset); };
  size_t next = 0;
  for (size_t li = 0; li < layers.size(); ++li)
    for_each_block(cfg, has_bias[li], fp8_experts, fp8_proj, layers[li],
                   [&](auto& member, Leaves, bool) { at(member, offsets[next++]); });
  size_t next_pad = 0, next_kn = 0;
  for (DeviceLayerWeights<T>& d : layers)
    for_each_projection(d, [&](Leaves, auto& s, auto& st) {
      if (proj_pad) at(s, off_pad[next_pad++]);
      if (proj_kn) at(st, off_pkn[next_kn++]);
    });
  for (size_t li = 0; li < layers.size(); ++li) {
    at(layers[li].experts_w13_st, off_kn[li].first);
    at(layers[li].experts_w2_st, off_kn[li].second);
  }
  at(embed_tokens, off_embed);
  at(embedding_norm, off_norm);
  at(lm_head, off_head);
  at(rope_inv_freq, off_inv_freq);
}

template class DeviceWeights<float>;
template class DeviceWeights<__nv_bfloat16>;
template class DeviceWeights<__half>;

}  // namespace lfm2
