// Helpers shared by the io / h5pack tests: a scratch directory, a small safetensors writer, a
// synthetic Hugging Face checkpoint writer (config.json + safetensors, per-expert or fused experts,
// tied or untied head, one file or shards), and HDF5 dataset listing.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "io/model_config.h"

namespace lfm2::test {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> entries() const;  // file names, sorted

 private:
  std::string path_;
};

// One tensor to write: `values` are rounded to `dtype` (round to nearest even).
struct StTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Raw bytes of values stored as `dtype`.
std::vector<uint8_t> to_bytes(const std::vector<float>& values, DType dtype);
// Writes a .safetensors file with a proper header (nlohmann::json, sorted names, contiguous data).
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors);
// Writes a file from a literal header text and data bytes (for corrupt-input tests).
void write_raw_safetensors(const std::string& path, const std::string& header, const std::vector<uint8_t>& data);

struct CheckpointOptions {
  DType dtype = DType::BF16;   // dtype of every source tensor
  bool fused_experts = false;  // gate_up_proj / down_proj instead of experts.{e}.w*
  int shards = 1;              // > 1: model-0000k-of-0000n.safetensors + index
  uint64_t seed = 1;
};

// A synthetic HF checkpoint of `cfg` in `dir`. Returns the source values by HF name (already
// rounded to the source dtype), per-expert names even when written fused.
std::map<std::string, StTensor> write_checkpoint(const std::string& dir, const ModelConfig& cfg,
                                                 const CheckpointOptions& opt);
// The same tensors, for tests that edit them before writing (by HF name as written on disk).
std::vector<StTensor> checkpoint_tensors(const ModelConfig& cfg, const CheckpointOptions& opt);
void write_checkpoint_tensors(const std::string& dir, const ModelConfig& cfg, const std::vector<StTensor>& tensors,
                              int shards = 1);

// Every dataset path in an HDF5 file.
std::set<std::string> list_datasets(const std::string& h5_path);

// A small config covering conv + attention and dense + MoE layers (4 layers, H 32, 4 experts).
ModelConfig small_config(bool tied = true);

}  // namespace lfm2::test
