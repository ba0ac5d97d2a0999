// Test helpers (see io_test_util.h).
#include "io_test_util.h"

#include <hdf5.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/rng.h"
#include "io/weight_names.h"

namespace lfm2::test {
namespace fs = std::filesystem;

ScratchDir::ScratchDir() {
  std::string tmpl = (fs::temp_directory_path() / "lfm2-io-test-XXXXXX").string();
  LFM2_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<std::string> ScratchDir::entries() const {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> to_bytes(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * dtype_size(dtype));
  convert_elements(out.data(), dtype, values.data(), DType::F32, values.size());
  return out;
}

void write_raw_safetensors(const std::string& path, const std::string& header, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<uint8_t> data;
  for (const auto& t : tensors) {
    auto bytes = to_bytes(t.values, t.dtype);
    const char* dt = t.dtype == DType::BF16 ? "BF16" : t.dtype == DType::F16 ? "F16" : t.dtype == DType::E4M3 ? "F8_E4M3" : "F32";
    header[t.name] = {{"dtype", dt}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  write_raw_safetensors(path, header.dump(), data);
}

namespace {

std::string with_expert(const std::string& hf, int64_t e) {
  std::string s = hf;
  s.replace(s.find("{e}"), 3, std::to_string(e));
  return s;
}

StTensor random_tensor(const std::string& name, std::vector<int64_t> shape, DType dtype, uint64_t seed) {
  StTensor t{name, dtype, std::move(shape), {}};
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  const CounterRng rng(seed, std::hash<std::string>{}(name));
  t.values.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) t.values[size_t(i)] = float(rng.symmetric(uint64_t(i)) * 1.5);
  // Round to the source dtype so that the values are exactly what the file holds.
  std::vector<uint8_t> bytes = to_bytes(t.values, dtype);
  convert_elements(t.values.data(), DType::F32, bytes.data(), dtype, t.values.size());
  return t;
}

}  // namespace

std::map<std::string, StTensor> write_checkpoint(const std::string& dir, const ModelConfig& cfg,
                                                 const CheckpointOptions& opt) {
  CheckpointOptions per_expert = opt;
  per_expert.fused_experts = false;
  std::map<std::string, StTensor> by_name;
  for (auto& t : checkpoint_tensors(cfg, per_expert)) by_name[t.name] = t;
  write_checkpoint_tensors(dir, cfg, checkpoint_tensors(cfg, opt), opt.shards);
  return by_name;
}

std::vector<StTensor> checkpoint_tensors(const ModelConfig& cfg, const CheckpointOptions& opt) {
  std::vector<StTensor> out;
  for (const auto& spec : model_tensor_specs(cfg)) {
    if (spec.hf_name.find("{e}") == std::string::npos) {
      auto shape = spec.shape;
      if (spec.hf_name.find("conv.conv.weight") != std::string::npos) shape = {spec.shape[0], 1, spec.shape[1]};
      out.push_back(random_tensor(spec.hf_name, shape, opt.dtype, opt.seed));
      continue;
    }
    const int64_t E = spec.shape[0], a = spec.shape[1], b = spec.shape[2];
    std::vector<StTensor> experts;
    for (int64_t e = 0; e < E; ++e)
      experts.push_back(random_tensor(with_expert(spec.hf_name, e), {a, b}, opt.dtype, opt.seed));
    if (!opt.fused_experts) {
      out.insert(out.end(), experts.begin(), experts.end());
      continue;
    }
    const std::string prefix = spec.hf_name.substr(0, spec.hf_name.find("{e}"));
    const std::string leaf = spec.path.substr(spec.path.rfind('/') + 1);
    if (leaf == "w2") {
      StTensor down{prefix + "down_proj", opt.dtype, {E, a, b}, {}};
      for (auto& x : experts) down.values.insert(down.values.end(), x.values.begin(), x.values.end());
      out.push_back(down);
    } else if (leaf == "w1") {
      // Stash w1; gate_up_proj is assembled when w3 arrives: per expert, w1 rows then w3 rows.
      StTensor gate_up{prefix + "gate_up_proj", opt.dtype, {E, 2 * a, b}, {}};
      for (auto& x : experts) gate_up.values.insert(gate_up.values.end(), x.values.begin(), x.values.end());
      out.push_back(gate_up);
    } else {
      auto it = std::find_if(out.begin(), out.end(), [&](const StTensor& t) { return t.name == prefix + "gate_up_proj"; });
      LFM2_CHECK(it != out.end(), "w3 before w1");
      std::vector<float> merged;
      const size_t per = size_t(a * b);
      for (int64_t e = 0; e < E; ++e) {
        merged.insert(merged.end(), it->values.begin() + e * per, it->values.begin() + (e + 1) * per);
        merged.insert(merged.end(), experts[e].values.begin(), experts[e].values.end());
      }
      it->values = std::move(merged);
    }
  }
  return out;
}

void write_checkpoint_tensors(const std::string& dir, const ModelConfig& cfg, const std::vector<StTensor>& tensors,
                              int shards) {
  fs::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json");
    f << cfg.to_json().dump(2);
  }
  if (shards <= 1) {
    write_safetensors(dir + "/model.safetensors", tensors);
    return;
  }
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  index["weight_map"] = nlohmann::json::object();
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<StTensor> part;
    for (size_t i = size_t(s); i < tensors.size(); i += size_t(shards)) {
      part.push_back(tensors[i]);
      index["weight_map"][tensors[i].name] = name;
    }
    write_safetensors(dir + "/" + name, part);
  }
  std::ofstream f(dir + "/model.safetensors.index.json");
  f << index.dump(2);
}

namespace {
herr_t visit(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::set<std::string>*>(out)->insert(name);
  return 0;
}
}  // namespace

std::set<std::string> list_datasets(const std::string& h5_path) {
  std::set<std::string> out;
  hid_t f = H5Fopen(h5_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  LFM2_CHECK(f >= 0, h5_path, ": cannot open");
  H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out);
  H5Fclose(f);
  return out;
}

ModelConfig small_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.moe_intermediate_size = 16;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_dense_layers = 2;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = tied;
  c.layer_types = {"conv", "full_attention", "conv", "full_attention"};
  c.validate("small_config");
  return c;
}

}  // namespace lfm2::test
