// The model's hyper-parameters, mirroring the Hugging Face Lfm2MoeConfig (config.json) keys.
//
// Parsed once from JSON (a checkpoint's config.json or the `config_json` attribute of a weight
// file), validated, and then asked: is_attention(il), is_moe(il). Nothing else in the project
// hard-codes a model dimension.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/fp8.h"

namespace lfm2 {

// FP8 weights (docs/fp8.md), config key quantization_config as Hugging Face's FP8 checkpoints write
// it ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size":
// [128, 128]}) plus "lfm2_scheme" ("channel" | "block128") and "lfm2_modules" ("experts" |
// "projections": every expert, dense, attention and conv projection). A published checkpoint's
// config (no lfm2_* keys) reads as block128 when it has weight_block_size, modules "projections".
struct Fp8Weights {
  bool on = false;
  Fp8Scheme scheme = Fp8Scheme::Channel;
  bool projections = false;  // beside the experts: dense, attention and conv projections
};

struct ModelConfig {
  int64_t vocab_size = 65536;
  int64_t hidden_size = 2048;
  int64_t intermediate_size = 7168;      // dense SwiGLU layers
  int64_t moe_intermediate_size = 1792;  // each expert
  int64_t num_hidden_layers = 24;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t max_position_embeddings = 128000;
  double norm_eps = 1e-5;
  double rope_theta = 1e6;
  bool conv_bias = false;
  int64_t conv_L_cache = 3;
  int64_t num_dense_layers = 2;
  int64_t num_experts = 32;
  int64_t num_experts_per_tok = 4;
  bool use_expert_bias = true;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  bool tie_word_embeddings = true;
  std::vector<std::string> layer_types;  // "full_attention" or "conv", one per layer
  Fp8Weights fp8;                        // quantization_config; off for bf16/fp16/fp32 files

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool is_attention(int il) const { return layer_types.at(il) == "full_attention"; }
  bool is_moe(int il) const { return il >= num_dense_layers; }

  // Parses HF config.json keys (rope_parameters.rope_theta or legacy rope_theta; layer_types or
  // legacy full_attn_idxs) and validates. `where` names the source in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
  static ModelConfig from_json_text(const std::string& text, const std::string& where);
  static ModelConfig from_file(const std::string& path);  // a config.json

  // The same keys back, as HF writes them (model_type "lfm2_moe", rope_parameters).
  nlohmann::json to_json() const;
  std::string to_json_text() const;

  // Throws lfm2::Error naming `where` and the first inconsistency found.
  void validate(const std::string& where) const;

  // Parameter counts (embedding counted once when tied).
  int64_t layer_params(int il) const;
  int64_t total_params() const;

  // Relative forward cost of layer il per token (FLOPs), used to balance pipeline stages.
  double layer_flops_per_token(int il, int64_t seq_len) const;
};

}  // namespace lfm2
