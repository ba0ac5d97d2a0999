// Loading a stage's weights as fp32, driven by the name table: every tensor of the stage's spec
// list is read once into the member its leaf name maps to; an unknown leaf is an error. An fp8
// matrix is dequantized with its scales as they arrive (w = e4m3 * scale, one fp32 rounding).
#include "model/layer_weights.h"

#include <map>
#include <string>

#include "common/error.h"
#include "io/weight_names.h"

namespace lfm2 {

namespace {

int64_t vec_bytes(const std::vector<float>& v) { return int64_t(v.size() * sizeof(float)); }

// The member of LayerWeights that holds a dataset leaf ("self_attn/q_proj", ...).
std::vector<float>* layer_member(LayerWeights& w, const std::string& leaf) {
  static const std::map<std::string, std::vector<float> LayerWeights::*> kMembers = {
      {names::kOperatorNorm, &LayerWeights::operator_norm},
      {names::kFfnNorm, &LayerWeights::ffn_norm},
      {names::kQProj, &LayerWeights::q_proj},
      {names::kKProj, &LayerWeights::k_proj},
      {names::kVProj, &LayerWeights::v_proj},
      {names::kOutProj, &LayerWeights::out_proj},
      {names::kQLayernorm, &LayerWeights::q_layernorm},
      {names::kKLayernorm, &LayerWeights::k_layernorm},
      {names::kConv, &LayerWeights::conv},
      {names::kConvInProj, &LayerWeights::conv_in_proj},
      {names::kConvOutProj, &LayerWeights::conv_out_proj},
      {names::kW1, &LayerWeights::w1},
      {names::kW3, &LayerWeights::w3},
      {names::kW2, &LayerWeights::w2},
      {names::kGate, &LayerWeights::gate},
      {names::kExpertBias, &LayerWeights::expert_bias},
      {names::kExpertsW1, &LayerWeights::experts_w1},
      {names::kExpertsW3, &LayerWeights::experts_w3},
      {names::kExpertsW2, &LayerWeights::experts_w2},
  };
  auto it = kMembers.find(leaf);
  LFM2_CHECK(it != kMembers.end(), "layer weights: no member for dataset leaf '", leaf, "'");
  return &(w.*(it->second));
}

// The fp8 matrix `m` (read as its e4m3 values) times its scales, read from `spec` and checked:
// w = q * scale per output row or per 128 x 128 block, each stacked matrix (expert) on its own.
void dequantize_fp8(WeightReader& reader, const TensorSpec& spec, const TensorSpec& matrix, std::vector<float>& m,
                    Fp8Scheme scheme) {
  const std::vector<float> scale = reader.read_f32(spec);
  check_fp8_scales(reader.path(), spec.path, scale.data(), int64_t(scale.size()));
  const size_t n = matrix.shape.size();
  const int64_t rows = matrix.shape[n - 2], cols = matrix.shape[n - 1];
  const int64_t tr = scheme == Fp8Scheme::Channel ? 1 : kFp8Block, tc = scheme == Fp8Scheme::Channel ? cols : kFp8Block;
  const int64_t sr = fp8_scale_rows(scheme, rows), sc = fp8_scale_cols(scheme, cols);
  const int64_t n_mat = matrix.numel() / (rows * cols);
  for (int64_t b = 0; b < n_mat; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = m.data() + (b * rows + r) * cols;
      const float* s = scale.data() + (b * sr + r / tr) * sc;
      for (int64_t c = 0; c < cols; ++c) row[c] *= s[c / tc];
    }
}

}  // namespace

int64_t LayerWeights::bytes() const {
  int64_t n = 0;
  for (const auto* v : {&operator_norm, &ffn_norm, &q_proj, &k_proj, &v_proj, &out_proj, &q_layernorm, &k_layernorm,
                        &conv, &conv_in_proj, &conv_out_proj, &w1, &w3, &w2, &gate, &expert_bias, &experts_w1,
                        &experts_w3, &experts_w2})
    n += vec_bytes(*v);
  return n;
}

LayerWeights load_layer_weights(WeightReader& reader, int il) {
  const ModelConfig& cfg = reader.config();
  LayerWeights w;
  w.il = il;
  w.is_attention = cfg.is_attention(il);
  w.is_moe = cfg.is_moe(il);
  const std::string prefix = layer_path(il, "");
  const std::vector<TensorSpec> specs = layer_tensor_specs(cfg, il);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    LFM2_CHECK(spec.path.compare(0, prefix.size(), prefix) == 0, "layer weights: ", spec.path, " is not under ",
               prefix);
    const std::string leaf = spec.path.substr(prefix.size());
    if (is_fp8_scale_leaf(leaf)) {  // the name table puts a scale right after its matrix
      LFM2_CHECK(i > 0 && fp8_scale_leaf(specs[i - 1].path) == spec.path, "layer weights: ", spec.path,
                 " does not follow its matrix");
      dequantize_fp8(reader, spec, specs[i - 1], *layer_member(w, leaf.substr(0, leaf.size() - 6)), cfg.fp8.scheme);
      continue;
    }
    *layer_member(w, leaf) = reader.read_f32(spec);
  }
  return w;
}

const float* ModelWeights::head_matrix() const {
  const auto& m = config.tie_word_embeddings ? embed_tokens : lm_head;
  LFM2_CHECK(!m.empty(), "model weights: the LM head is not loaded (not the last stage)");
  return m.data();
}

int64_t ModelWeights::bytes() const {
  int64_t n = vec_bytes(embed_tokens) + vec_bytes(embedding_norm) + vec_bytes(lm_head);
  for (const auto& l : layers) n += l.bytes();
  return n;
}

ModelWeights load_model_weights(WeightReader& reader, const StageLayers& stage) {
  ModelWeights m;
  m.config = reader.config();
  m.stage = stage;
  // stage_tensor_specs() is the list of what this stage reads; walk it so that nothing else is.
  for (const TensorSpec& spec : stage_tensor_specs(m.config, stage)) {
    if (spec.layer >= 0) {
      if (m.layers.empty() || m.layers.back().il != spec.layer) m.layers.push_back(load_layer_weights(reader, spec.layer));
    } else if (spec.path == names::kEmbedTokens) {
      m.embed_tokens = reader.read_f32(spec);
    } else if (spec.path == names::kEmbeddingNorm) {
      m.embedding_norm = reader.read_f32(spec);
    } else if (spec.path == names::kLmHead) {
      m.lm_head = reader.read_f32(spec);
    } else {
      LFM2_FAIL("model weights: unexpected model-level dataset '", spec.path, "'");
    }
  }
  LFM2_CHECK(int(m.layers.size()) == stage.n_layers(), reader.path(), ": loaded ", m.layers.size(),
             " layers for range [", stage.layer_begin, ", ", stage.layer_end, ")");
  return m;
}

}  // namespace lfm2
