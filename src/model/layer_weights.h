// A stage's weights in fp32 host memory, loaded through the name table (io/weight_names.h).
//
// LayerWeights holds one decoder layer with named members; members a layer kind does not use stay
// empty. ModelWeights holds a stage's layers (io/stage_layers.h) plus the embedding (first stage, or last when
// tied), the final norm and the untied head (last stage); nothing else is read from the file.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "io/weight_file.h"

namespace lfm2 {

struct LayerWeights {
  int il = -1;
  bool is_attention = false, is_moe = false;

  std::vector<float> operator_norm;  // (H)
  std::vector<float> ffn_norm;       // (H)

  // attention layers
  std::vector<float> q_proj;       // (nh*hd, H)
  std::vector<float> k_proj;       // (nkv*hd, H)
  std::vector<float> v_proj;       // (nkv*hd, H)
  std::vector<float> out_proj;     // (H, nh*hd)
  std::vector<float> q_layernorm;  // (hd)
  std::vector<float> k_layernorm;  // (hd)

  // short-conv layers
  std::vector<float> conv;           // (H, L)
  std::vector<float> conv_in_proj;   // (3H, H)
  std::vector<float> conv_out_proj;  // (H, H)

  // dense FFN layers
  std::vector<float> w1;  // (I, H)
  std::vector<float> w3;  // (I, H)
  std::vector<float> w2;  // (H, I)

  // MoE layers
  std::vector<float> gate;         // (E, H)
  std::vector<float> expert_bias;  // (E), empty when !use_expert_bias
  std::vector<float> experts_w1;   // (E, Im, H)
  std::vector<float> experts_w3;   // (E, Im, H)
  std::vector<float> experts_w2;   // (E, H, Im)

  int64_t bytes() const;
};

// Reads layer il's tensors (shapes checked against the name table).
LayerWeights load_layer_weights(WeightReader& reader, int il);

struct ModelWeights {
  ModelConfig config;
  StageLayers stage;                 // the layers held, and whether first / last

  std::vector<LayerWeights> layers;  // stage.layer_begin .. stage.layer_end-1
  std::vector<float> embed_tokens;   // (V, H): first stage, and last stage when tied
  std::vector<float> embedding_norm; // (H): last stage
  std::vector<float> lm_head;        // (V, H): last stage when untied

  const LayerWeights& layer(int il) const { return layers.at(size_t(il - stage.layer_begin)); }
  // The LM head matrix (V, H): lm_head, or embed_tokens when tied.
  const float* head_matrix() const;
  int64_t bytes() const;
};

// Reads exactly the datasets stage_tensor_specs() lists for the stage.
ModelWeights load_model_weights(WeightReader& reader, const StageLayers& stage);

}  // namespace lfm2
