// The named model shapes of `h5pack synth` (see presets.h).
#include "h5pack/presets.h"

#include "common/error.h"

namespace lfm2 {
namespace {

std::vector<std::string> layout(int n_layers, const std::vector<int>& attention) {
  std::vector<std::string> t(size_t(n_layers), "conv");
  for (int il : attention) t[size_t(il)] = "full_attention";
  return t;
}

}  // namespace

std::vector<std::string> synth_preset_names() { return {"lfm2-8b-a1b", "lfm2-mini", "lfm2-tiny"}; }

ModelConfig synth_preset(const std::string& name) {
  ModelConfig c;  // the defaults are LFM2-8B-A1B's
  c.layer_types = layout(24, {2, 6, 10, 14, 18, 21});
  if (name == "lfm2-8b-a1b") {
    // as is
  } else if (name == "lfm2-mini") {
    c.vocab_size = 8192;
    c.hidden_size = 256;
    c.intermediate_size = 768;
    c.moe_intermediate_size = 128;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.max_position_embeddings = 4096;
  } else if (name == "lfm2-tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.num_dense_layers = 2;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = 4096;
    c.layer_types = layout(6, {1, 4});
  } else {
    std::string known;
    for (const auto& n : synth_preset_names()) known += (known.empty() ? "" : ", ") + n;
    LFM2_FAIL("unknown preset '", name, "' (known: ", known, ")");
  }
  c.validate(cat("preset ", name));
  return c;
}

}  // namespace lfm2
