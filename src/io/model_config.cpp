#include "io/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_kind.h"

namespace lfm2 {
namespace {

template <typename T>
void get_opt(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(where, ": config key '", key, "' has the wrong type (", e.what(), ")"));
  }
}

// quantization_config: fp8 (e4m3, dynamic activations, 128 x 128 blocks or per channel) only.
Fp8Weights parse_fp8(const nlohmann::json& q, const std::string& where) {
  LFM2_CHECK(q.is_object(), where, ": quantization_config is not a JSON object");
  std::string method, fmt = "e4m3", act = "dynamic", scheme, modules = "projections";
  get_opt(q, "quant_method", method, where);
  LFM2_CHECK(method == "fp8", where, ": quantization_config.quant_method '", method, "' is not supported (fp8 only)");
  get_opt(q, "fmt", fmt, where);
  LFM2_CHECK(fmt == "e4m3", where, ": quantization_config.fmt '", fmt, "' is not supported (e4m3 only)");
  get_opt(q, "activation_scheme", act, where);
  LFM2_CHECK(act == "dynamic", where, ": quantization_config.activation_scheme '", act,
             "' is not supported (dynamic only: static activation scales are not read)");
  std::vector<int64_t> block;
  get_opt(q, "weight_block_size", block, where);
  LFM2_CHECK(block.empty() || (block.size() == 2 && block[0] == kFp8Block && block[1] == kFp8Block), where,
             ": quantization_config.weight_block_size must be [128, 128]");
  get_opt(q, "lfm2_scheme", scheme, where);
  get_opt(q, "lfm2_modules", modules, where);
  Fp8Weights f;
  f.on = true;
  f.scheme = scheme.empty() ? (block.empty() ? Fp8Scheme::Channel : Fp8Scheme::Block128) : parse_fp8_scheme(scheme);
  LFM2_CHECK((f.scheme == Fp8Scheme::Block128) == !block.empty(), where,
             ": quantization_config: weight_block_size goes with lfm2_scheme block128 only");
  LFM2_CHECK(modules == "experts" || modules == "projections", where, ": quantization_config.lfm2_modules '",
             modules, "' (expected experts or projections)");
  f.projections = modules == "projections";
  return f;
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& where) {
  LFM2_CHECK(j.is_object(), where, ": config is not a JSON object");
  if (j.contains("model_type")) {
    auto mt = j["model_type"];
    LFM2_CHECK(mt.is_string() && mt.get<std::string>() == "lfm2_moe", where,
               ": model_type is ", mt.dump(), ", expected \"lfm2_moe\"");
  }
  ModelConfig c;
  get_opt(j, "vocab_size", c.vocab_size, where);
  get_opt(j, "hidden_size", c.hidden_size, where);
  get_opt(j, "intermediate_size", c.intermediate_size, where);
  get_opt(j, "moe_intermediate_size", c.moe_intermediate_size, where);
  get_opt(j, "num_hidden_layers", c.num_hidden_layers, where);
  get_opt(j, "num_attention_heads", c.num_attention_heads, where);
  get_opt(j, "num_key_value_heads", c.num_key_value_heads, where);
  get_opt(j, "max_position_embeddings", c.max_position_embeddings, where);
  get_opt(j, "norm_eps", c.norm_eps, where);
  get_opt(j, "conv_bias", c.conv_bias, where);
  get_opt(j, "conv_L_cache", c.conv_L_cache, where);
  get_opt(j, "num_dense_layers", c.num_dense_layers, where);
  get_opt(j, "num_experts", c.num_experts, where);
  get_opt(j, "num_experts_per_tok", c.num_experts_per_tok, where);
  get_opt(j, "use_expert_bias", c.use_expert_bias, where);
  get_opt(j, "routed_scaling_factor", c.routed_scaling_factor, where);
  get_opt(j, "norm_topk_prob", c.norm_topk_prob, where);
  get_opt(j, "tie_word_embeddings", c.tie_word_embeddings, where);
  get_opt(j, "rope_theta", c.rope_theta, where);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const auto& rp = j["rope_parameters"];
    get_opt(rp, "rope_theta", c.rope_theta, where);
    std::string type = "default";
    get_opt(rp, "rope_type", type, where);
    LFM2_CHECK(type == "default", where, ": rope_type '", type, "' is not supported (only \"default\")");
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    get_opt(j, "layer_types", c.layer_types, where);
  } else if (j.contains("full_attn_idxs") && !j["full_attn_idxs"].is_null()) {
    std::vector<int64_t> idx;
    get_opt(j, "full_attn_idxs", idx, where);
    c.layer_types.assign(c.num_hidden_layers, "conv");
    for (auto i : idx) {
      LFM2_CHECK(i >= 0 && i < c.num_hidden_layers, where, ": full_attn_idxs entry ", i, " out of range");
      c.layer_types[i] = "full_attention";
    }
  } else {
    throw Error(cat(where, ": config has neither layer_types nor full_attn_idxs"));
  }
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    c.fp8 = parse_fp8(j["quantization_config"], where);
  c.validate(where);
  return c;
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, or a number JSON cannot hold (1e999)
    throw Error(cat(where, ": invalid JSON (", e.what(), ")"));
  }
  return from_json(j, where);
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  check_input_file("config file", path);
  std::ifstream f(path);
  LFM2_CHECK(f.good(), path, ": cannot open config file");
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_text(ss.str(), path);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j;
  j["model_type"] = "lfm2_moe";
  j["architectures"] = {"Lfm2MoeForCausalLM"};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["max_position_embeddings"] = max_position_embeddings;
  j["norm_eps"] = norm_eps;
  j["conv_bias"] = conv_bias;
  j["conv_L_cache"] = conv_L_cache;
  j["num_dense_layers"] = num_dense_layers;
  j["num_experts"] = num_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["use_expert_bias"] = use_expert_bias;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["norm_topk_prob"] = norm_topk_prob;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["layer_types"] = layer_types;
  if (fp8.on) {
    nlohmann::json q = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                        {"lfm2_scheme", fp8_scheme_name(fp8.scheme)},
                        {"lfm2_modules", fp8.projections ? "projections" : "experts"}};
    if (fp8.scheme == Fp8Scheme::Block128) q["weight_block_size"] = {kFp8Block, kFp8Block};
    j["quantization_config"] = q;
  }
  return j;
}

std::string ModelConfig::to_json_text() const { return to_json().dump(1); }

void ModelConfig::validate(const std::string& where) const {
  auto pos = [&](int64_t v, const char* key) {
    LFM2_CHECK(v > 0, where, ": config ", key, " = ", v, " must be positive");
  };
  pos(vocab_size, "vocab_size");
  pos(hidden_size, "hidden_size");
  pos(intermediate_size, "intermediate_size");
  pos(num_hidden_layers, "num_hidden_layers");
  pos(num_attention_heads, "num_attention_heads");
  pos(num_key_value_heads, "num_key_value_heads");
  pos(max_position_embeddings, "max_position_embeddings");
  pos(conv_L_cache, "conv_L_cache");
  LFM2_CHECK(vocab_size <= (int64_t(1) << 31), where, ": vocab_size ", vocab_size, " does not fit int32 token ids");
  LFM2_CHECK(hidden_size % num_attention_heads == 0, where, ": hidden_size ", hidden_size,
             " is not a multiple of num_attention_heads ", num_attention_heads);
  LFM2_CHECK(head_dim() % 2 == 0, where, ": head_dim ", head_dim(), " must be even for RoPE");
  LFM2_CHECK(num_attention_heads % num_key_value_heads == 0, where, ": num_attention_heads ",
             num_attention_heads, " is not a multiple of num_key_value_heads ", num_key_value_heads);
  // Upper bounds far above any real model, so that every size the tools compute fits int64.
  auto at_most = [&](int64_t v, int64_t hi, const char* key) {
    LFM2_CHECK(v <= hi, where, ": config ", key, " = ", v, " is more than ", hi);
  };
  at_most(hidden_size, int64_t(1) << 20, "hidden_size");
  at_most(intermediate_size, int64_t(1) << 22, "intermediate_size");
  at_most(moe_intermediate_size, int64_t(1) << 22, "moe_intermediate_size");
  at_most(num_hidden_layers, int64_t(1) << 14, "num_hidden_layers");
  at_most(num_experts, int64_t(1) << 14, "num_experts");
  at_most(conv_L_cache, int64_t(1) << 10, "conv_L_cache");
  at_most(max_position_embeddings, (int64_t(1) << 31) - 1, "max_position_embeddings");
  auto finite_positive = [&](double v, const char* key, double hi) {
    LFM2_CHECK(std::isfinite(v) && v > 0 && v < hi, where, ": config ", key, " = ", v, " must be ",
               hi == HUGE_VAL ? std::string("a finite positive number") : cat("in (0, ", hi, ")"));
  };
  finite_positive(norm_eps, "norm_eps", 1.0);
  finite_positive(rope_theta, "rope_theta", HUGE_VAL);
  finite_positive(routed_scaling_factor, "routed_scaling_factor", HUGE_VAL);
  LFM2_CHECK(!conv_bias, where, ": conv_bias = true is not supported");
  LFM2_CHECK(int64_t(layer_types.size()) == num_hidden_layers, where, ": layer_types has ",
             layer_types.size(), " entries but num_hidden_layers is ", num_hidden_layers);
  for (size_t i = 0; i < layer_types.size(); ++i)
    LFM2_CHECK(layer_types[i] == "full_attention" || layer_types[i] == "conv", where, ": layer_types[", i,
               "] = '", layer_types[i], "' (expected \"full_attention\" or \"conv\")");
  LFM2_CHECK(num_dense_layers >= 0 && num_dense_layers <= num_hidden_layers, where,
             ": num_dense_layers ", num_dense_layers, " out of range");
  if (num_dense_layers < num_hidden_layers) {
    pos(num_experts, "num_experts");
    pos(moe_intermediate_size, "moe_intermediate_size");
    LFM2_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= num_experts, where,
               ": num_experts_per_tok ", num_experts_per_tok, " must be in 1..num_experts (", num_experts, ")");
  }
  double params = 2.0 * double(vocab_size) * double(hidden_size);
  for (int il = 0; il < int(num_hidden_layers); ++il)
    params += double(hidden_size) * (4.0 * hidden_size + 3.0 * (is_moe(il) ? double(num_experts) * moe_intermediate_size
                                                                            : double(intermediate_size)));
  LFM2_CHECK(params < 0x1p52, where, ": the config describes about ", params, " parameters, too many to hold");
}

int64_t ModelConfig::layer_params(int il) const {
  const int64_t H = hidden_size, hd = head_dim();
  int64_t p = 2 * H;  // operator_norm, ffn_norm
  if (is_attention(il))
    p += H * num_attention_heads * hd * 2 + H * num_key_value_heads * hd * 2 + 2 * hd;
  else
    p += 3 * H * H + H * H + H * conv_L_cache;
  if (is_moe(il))
    p += num_experts * H + (use_expert_bias ? num_experts : 0) + num_experts * 3 * H * moe_intermediate_size;
  else
    p += 3 * H * intermediate_size;
  return p;
}

int64_t ModelConfig::total_params() const {
  int64_t p = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + hidden_size;
  for (int il = 0; il < num_hidden_layers; ++il) p += layer_params(il);
  return p;
}

double ModelConfig::layer_flops_per_token(int il, int64_t seq_len) const {
  const double H = double(hidden_size), hd = double(head_dim());
  double f = 0;
  if (is_attention(il)) {
    f += 2 * H * hd * (2 * num_attention_heads + 2 * num_key_value_heads);
    f += 2.0 * num_attention_heads * hd * double(seq_len);  // causal QK^T and PV, on average S/2 keys each
  } else {
    f += 2 * H * 4 * H + 2 * H * double(conv_L_cache);
  }
  if (is_moe(il))
    f += 2 * H * num_experts + 2 * 3 * H * double(moe_intermediate_size) * double(num_experts_per_tok);
  else
    f += 2 * 3 * H * double(intermediate_size);
  return f;
}

}  // namespace lfm2
