// `h5pack convert`: a Hugging Face LFM2-MoE checkpoint directory (config.json + safetensors) to one
// weight file.
//
// Every tensor of the name table (io/weight_names.h) is taken from the checkpoint:
//  - experts either per expert (`...experts.{e}.w1/w2/w3.weight`, stacked into (E, Im, H) /
//    (E, H, Im)) or in the fused transformers-5 spelling (`...experts.gate_up_proj` (E, 2*Im, H),
//    gate (w1) rows first then up (w3), and `...experts.down_proj` (E, H, Im)); one spelling per layer;
//  - `conv.conv.weight` (H, 1, L) is stored (H, L);
//  - `lm_head.weight` must be present iff tie_word_embeddings is false.
// The whole checkpoint is validated before anything is written: a tensor missing, of the wrong
// shape (the config contradicting the checkpoint) or unsupported dtype, or any tensor the name
// table does not use, is an error naming the file and the tensor. Data is streamed in blocks of
// at most 64 MiB, so memory stays bounded whatever the model size.
#pragma once

#include <optional>
#include <string>

#include "common/dtype.h"

namespace lfm2 {

// `dtype`: the stored matrix dtype; by default the checkpoint's (that of model.embed_tokens.weight).
void convert_checkpoint(const std::string& dir, const std::string& out, std::optional<DType> dtype,
                        bool progress);
inline void convert_checkpoint(const std::string& dir, const std::string& out, std::optional<DType> dtype) {
  convert_checkpoint(dir, out, dtype, false);
}

}  // namespace lfm2
