// The name table: the single source of truth for what a weight file holds, where, and in which
// shape, plus the Hugging Face checkpoint name each dataset comes from.
//
// Dataset paths mirror the HF module names under "model." with per-expert tensors stacked:
//   embed_tokens                          (V, H)
//   layers/<il>/operator_norm             (H)        ffn_norm (H)
//   layers/<il>/self_attn/q_proj          (nh*hd, H) k_proj, v_proj (nkv*hd, H); out_proj (H, nh*hd)
//   layers/<il>/self_attn/q_layernorm     (hd)       k_layernorm (hd)
//   layers/<il>/conv/conv                 (H, L)     HF conv.conv.weight (H, 1, L) squeezed
//   layers/<il>/conv/in_proj              (3H, H)    out_proj (H, H)
//   layers/<il>/feed_forward/w1, w3       (I, H)     w2 (H, I)                 dense layers
//   layers/<il>/feed_forward/gate         (E, H)     expert_bias (E)           MoE layers
//   layers/<il>/feed_forward/experts/w1   (E, Im, H) w3 (E, Im, H); w2 (E, H, Im)
//   embedding_norm                        (H)
//   lm_head                               (V, H)     only when the head is untied
// Vectors (rank 1) are stored fp32; matrices in the file's weight dtype. An FP8 file (config
// quantization_config, docs/fp8.md) stores its quantized matrices e4m3, each followed by
//   <leaf>_scale  fp32, per output row (..., rows) or per 128 x 128 block (..., ceil(rows/128), ceil(cols/128))
// HF name <name>.weight_scale_inv (the published checkpoints' multiplier: W = q * scale).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/model_config.h"
#include "io/stage_layers.h"

namespace lfm2 {

struct TensorSpec {
  std::string path;            // HDF5 dataset path, e.g. "layers/3/self_attn/q_proj"
  std::vector<int64_t> shape;  // as stored
  int layer = -1;              // owning layer, -1 for model-level tensors
  std::string hf_name;         // HF checkpoint name; for stacked experts it contains "{e}"
  std::optional<DType> dtype;  // a fixed stored dtype (FP8 matrices e4m3, their scales fp32)
  int64_t numel() const;
  bool is_vector() const { return shape.size() == 1; }
};

namespace names {
inline constexpr const char* kEmbedTokens = "embed_tokens";
inline constexpr const char* kEmbeddingNorm = "embedding_norm";
inline constexpr const char* kLmHead = "lm_head";

// Leaves of a layer's datasets (layer_path(il, leaf)); LayerWeights names its members after them.
inline constexpr const char* kOperatorNorm = "operator_norm";
inline constexpr const char* kFfnNorm = "ffn_norm";
inline constexpr const char* kQProj = "self_attn/q_proj";
inline constexpr const char* kKProj = "self_attn/k_proj";
inline constexpr const char* kVProj = "self_attn/v_proj";
inline constexpr const char* kOutProj = "self_attn/out_proj";
inline constexpr const char* kQLayernorm = "self_attn/q_layernorm";
inline constexpr const char* kKLayernorm = "self_attn/k_layernorm";
inline constexpr const char* kConv = "conv/conv";
inline constexpr const char* kConvInProj = "conv/in_proj";
inline constexpr const char* kConvOutProj = "conv/out_proj";
inline constexpr const char* kW1 = "feed_forward/w1";
inline constexpr const char* kW3 = "feed_forward/w3";
inline constexpr const char* kW2 = "feed_forward/w2";
inline constexpr const char* kGate = "feed_forward/gate";
inline constexpr const char* kExpertBias = "feed_forward/expert_bias";
inline constexpr const char* kExpertsW1 = "feed_forward/experts/w1";
inline constexpr const char* kExpertsW3 = "feed_forward/experts/w3";
inline constexpr const char* kExpertsW2 = "feed_forward/experts/w2";
}  // namespace names

// "layers/<il>/<leaf>".
std::string layer_path(int il, const std::string& leaf);

// What a file whose matrices are weight_dtype stores the tensor as.
DType stored_dtype(const TensorSpec& spec, DType weight_dtype);
// Whether a layer's matrix leaf is quantized under cfg.fp8; its scale's leaf; whether a leaf is one.
bool is_fp8_leaf(const ModelConfig& cfg, const std::string& leaf);
std::string fp8_scale_leaf(const std::string& leaf);
bool is_fp8_scale_leaf(const std::string& leaf);
// The scale spec of a quantized matrix spec (last two dims rows, cols).
TensorSpec fp8_scale_spec(const TensorSpec& matrix, Fp8Scheme scheme);
// Throws "<file>: dataset '<path>': scale [i] = v (an fp8 scale must be finite and > 0)" for the
// first bad one of n scales, the first of which is element `first` of the dataset.
void check_fp8_scales(const std::string& file, const std::string& dataset, const float* scale, int64_t n,
                      int64_t first = 0);

// Every tensor of layer il, in file order.
std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& cfg, int il);

// Model-level tensors.
TensorSpec embed_spec(const ModelConfig& cfg);
TensorSpec embedding_norm_spec(const ModelConfig& cfg);
TensorSpec lm_head_spec(const ModelConfig& cfg);  // untied only

// Every tensor of the model in file order: embed_tokens, layers 0..L-1, embedding_norm, lm_head.
// Stage s's layers are therefore contiguous in the file.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg);

// What a pipeline stage reads: its layers, the embedding when first, and the final norm plus the
// head (the embedding when tied) when last.
std::vector<TensorSpec> stage_tensor_specs(const ModelConfig& cfg, const StageLayers& stage);

}  // namespace lfm2
