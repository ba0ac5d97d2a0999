#include "io/weight_names.h"

#include "common/error.h"

namespace lfm2 {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string layer_path(int il, const std::string& leaf) { return cat("layers/", il, "/", leaf); }

DType stored_dtype(const TensorSpec& spec, DType weight_dtype) {
  if (spec.dtype) return *spec.dtype;
  return spec.is_vector() ? DType::F32 : weight_dtype;
}

bool is_fp8_leaf(const ModelConfig& cfg, const std::string& leaf) {
  if (!cfg.fp8.on) return false;
  if (leaf == names::kExpertsW1 || leaf == names::kExpertsW3 || leaf == names::kExpertsW2) return true;
  if (!cfg.fp8.projections) return false;
  for (const char* l : {names::kQProj, names::kKProj, names::kVProj, names::kOutProj, names::kConvInProj,
                        names::kConvOutProj, names::kW1, names::kW3, names::kW2})
    if (leaf == l) return true;
  return false;
}

void check_fp8_scales(const std::string& file, const std::string& dataset, const float* scale, int64_t n,
                      int64_t first) {
  const int64_t bad = fp8_first_bad_scale(scale, n);
  LFM2_CHECK(bad < 0, file, ": dataset '", dataset, "': scale [", first + bad, "] = ", scale[bad < 0 ? 0 : bad],
             " (an fp8 scale must be finite and > 0)");
}

std::string fp8_scale_leaf(const std::string& leaf) { return leaf + "_scale"; }

bool is_fp8_scale_leaf(const std::string& leaf) {
  return leaf.size() > 6 && leaf.compare(leaf.size() - 6, 6, "_scale") == 0;
}

TensorSpec fp8_scale_spec(const TensorSpec& m, Fp8Scheme scheme) {
  const size_t n = m.shape.size();
  LFM2_CHECK(n >= 2, m.path, ": an fp8 matrix needs two dimensions");
  std::vector<int64_t> shape(m.shape.begin(), m.shape.end() - 2);
  shape.push_back(fp8_scale_rows(scheme, m.shape[n - 2]));
  if (scheme == Fp8Scheme::Block128) shape.push_back(fp8_scale_cols(scheme, m.shape[n - 1]));
  std::string hf = m.hf_name;
  const std::string w = ".weight";
  if (hf.size() >= w.size() && hf.compare(hf.size() - w.size(), w.size(), w) == 0) hf += "_scale_inv";
  return {m.path + "_scale", shape, m.layer, hf, DType::F32};
}

std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& cfg, int il) {
  const int64_t H = cfg.hidden_size, hd = cfg.head_dim();
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const std::string hf = cat("model.layers.", il, ".");
  std::vector<TensorSpec> out;
  auto add = [&](const std::string& leaf, std::vector<int64_t> shape, const std::string& hf_leaf) {
    out.push_back({layer_path(il, leaf), std::move(shape), il, hf + hf_leaf, {}});
    if (!is_fp8_leaf(cfg, leaf)) return;
    out.back().dtype = DType::E4M3;
    out.push_back(fp8_scale_spec(out.back(), cfg.fp8.scheme));
  };
  add(names::kOperatorNorm, {H}, "operator_norm.weight");
  if (cfg.is_attention(il)) {
    add(names::kQProj, {nh * hd, H}, "self_attn.q_proj.weight");
    add(names::kKProj, {nkv * hd, H}, "self_attn.k_proj.weight");
    add(names::kVProj, {nkv * hd, H}, "self_attn.v_proj.weight");
    add(names::kOutProj, {H, nh * hd}, "self_attn.out_proj.weight");
    add(names::kQLayernorm, {hd}, "self_attn.q_layernorm.weight");
    add(names::kKLayernorm, {hd}, "self_attn.k_layernorm.weight");
  } else {
    add(names::kConv, {H, cfg.conv_L_cache}, "conv.conv.weight");
    add(names::kConvInProj, {3 * H, H}, "conv.in_proj.weight");
    add(names::kConvOutProj, {H, H}, "conv.out_proj.weight");
  }
  add(names::kFfnNorm, {H}, "ffn_norm.weight");
  if (cfg.is_moe(il)) {
    const int64_t E = cfg.num_experts, Im = cfg.moe_intermediate_size;
    add(names::kGate, {E, H}, "feed_forward.gate.weight");
    if (cfg.use_expert_bias) add(names::kExpertBias, {E}, "feed_forward.expert_bias");
    add(names::kExpertsW1, {E, Im, H}, "feed_forward.experts.{e}.w1.weight");
    add(names::kExpertsW3, {E, Im, H}, "feed_forward.experts.{e}.w3.weight");
    add(names::kExpertsW2, {E, H, Im}, "feed_forward.experts.{e}.w2.weight");
  } else {
    const int64_t I = cfg.intermediate_size;
    add(names::kW1, {I, H}, "feed_forward.w1.weight");
    add(names::kW3, {I, H}, "feed_forward.w3.weight");
    add(names::kW2, {H, I}, "feed_forward.w2.weight");
  }
  return out;
}

TensorSpec embed_spec(const ModelConfig& cfg) {
  return {names::kEmbedTokens, {cfg.vocab_size, cfg.hidden_size}, -1, "model.embed_tokens.weight", {}};
}
TensorSpec embedding_norm_spec(const ModelConfig& cfg) {
  return {names::kEmbeddingNorm, {cfg.hidden_size}, -1, "model.embedding_norm.weight", {}};
}
TensorSpec lm_head_spec(const ModelConfig& cfg) {
  return {names::kLmHead, {cfg.vocab_size, cfg.hidden_size}, -1, "lm_head.weight", {}};
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg) {
  return stage_tensor_specs(cfg, whole_model(int(cfg.num_hidden_layers)));
}

std::vector<TensorSpec> stage_tensor_specs(const ModelConfig& cfg, const StageLayers& stage) {
  LFM2_CHECK(0 <= stage.layer_begin && stage.layer_begin <= stage.layer_end && stage.layer_end <= cfg.num_hidden_layers,
             "layer range [", stage.layer_begin, ", ", stage.layer_end, ") outside 0..", cfg.num_hidden_layers);
  std::vector<TensorSpec> out;
  if (stage.is_first() || (stage.is_last() && cfg.tie_word_embeddings)) out.push_back(embed_spec(cfg));
  for (int il = stage.layer_begin; il < stage.layer_end; ++il) {
    auto layer = layer_tensor_specs(cfg, il);
    out.insert(out.end(), layer.begin(), layer.end());
  }
  if (stage.is_last()) {
    out.push_back(embedding_norm_spec(cfg));
    if (!cfg.tie_word_embeddings) out.push_back(lm_head_spec(cfg));
  }
  return out;
}

}  // namespace lfm2
