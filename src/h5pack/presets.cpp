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

// A small model of the family: LFM2-8B-A1B's layout and defaults at another width.
struct Width {
  int64_t vocab, hidden, intermediate, moe_intermediate, heads, kv_heads, experts, experts_per_tok;
};

void set_width(ModelConfig& c, const Width& w) {
  c.vocab_size = w.vocab;
  c.hidden_size = w.hidden;
  c.intermediate_size = w.intermediate;
  c.moe_intermediate_size = w.moe_intermediate;
  c.num_attention_heads = w.heads;
  c.num_key_value_heads = w.kv_heads;
  c.num_experts = w.experts;
  c.num_experts_per_tok = w.experts_per_tok;
  c.max_position_embeddings = 4096;
}

}  // namespace

std::vector<std::string> synth_preset_names() { return {"lfm2-8b-a1b", "lfm2-mini", "lfm2-tiny"}; }

ModelConfig synth_preset(const std::string& name) {
  ModelConfig c;  // the defaults are LFM2-8B-A1B's
  c.layer_types = layout(24, {2, 6, 10, 14, 18, 21});
  if (name == "lfm2-8b-a1b") {
    // as is
  } else if (name == "lfm2-mini") {
    set_width(c, {8192, 256, 768, 128, 8, 2, 16, 4});
  } else if (name == "lfm2-tiny") {
    set_width(c, {512, 64, 128, 32, 4, 2, 8, 2});
    c.num_hidden_layers = 6;
    c.num_dense_layers = 2;
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
