// Streaming reader of Hugging Face safetensors checkpoints: one `model.safetensors` or shards
// listed by `model.safetensors.index.json`.
//
// Opening parses and validates every header (8-byte little-endian header length, JSON header,
// dtypes, shapes, byte ranges against the file size, overlaps, names duplicated across shards);
// tensor data is read on demand with pread, a tensor or a byte range at a time, never a whole file.
// Every error is one line naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace lfm2 {

struct SafeTensorInfo {
  std::string name;
  std::string file;             // path of the shard holding it
  DType dtype = DType::F32;     // BF16, F16 or F32 (others are rejected at open)
  std::vector<int64_t> shape;
  uint64_t offset = 0;          // absolute byte offset of the data in `file`
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsCheckpoint {
 public:
  // `path` is a checkpoint directory (model.safetensors, else model.safetensors.index.json), a
  // .safetensors file, or an index .json file.
  explicit SafetensorsCheckpoint(const std::string& path);
  ~SafetensorsCheckpoint();
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const SafeTensorInfo& info(const std::string& name) const;  // throws if absent
  std::vector<std::string> names() const;                     // sorted
  const std::vector<std::string>& files() const { return files_; }

  // Reads the whole tensor's raw little-endian bytes (info(name).nbytes of them) into `out`.
  void read(const std::string& name, void* out) const;
  // Reads `n_elems` elements starting at element `elem_begin` (flat, row-major), raw.
  void read_elements(const std::string& name, uint64_t elem_begin, uint64_t n_elems, void* out) const;

 private:
  void open_shard(const std::string& file);

  std::string path_;
  std::vector<std::string> files_;
  std::map<std::string, int> fds_;  // shard path -> open descriptor
  std::map<std::string, SafeTensorInfo> tensors_;
};

// "BF16" -> DType::BF16 etc.; false for any other safetensors dtype.
bool safetensors_dtype(const std::string& s, DType* out);
// DType::BF16 -> "BF16".
const char* safetensors_dtype_name(DType t);

}  // namespace lfm2
