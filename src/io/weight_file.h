// Reading and writing lfm2-rank weight files (format: docs/weight-format.md).
//
// A weight file is HDF5 with root attributes format="lfm2-rank-weights", format_version=1,
// config_json (the HF config.json keys) and weight_dtype, and one contiguous dataset per tensor at
// the paths of the name table (io/weight_names.h), written in file order with their space
// allocated at creation, so that one stage's bytes lie together. Stage files written by
// `h5pack split` add the attributes stage, n_stages, layer_begin, layer_end. Every file written
// here also carries the model's identity (io/model_identity.h): a fingerprint and the digest of
// every tensor, which the reader checks as it reads each tensor whole.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/pending_file.h"
#include "common/xxhash64.h"
#include "io/h5_util.h"
#include "io/model_config.h"
#include "io/model_identity.h"
#include "io/model_text.h"
#include "io/weight_names.h"

namespace lfm2 {

inline constexpr const char* kWeightFormat = "lfm2-rank-weights";
inline constexpr int64_t kWeightFormatVersion = 1;

// Writes a new weight file under a temporary name in the same directory and renames it into place
// on commit(); if destroyed before commit() (or interrupted, see common/pending_file.h) the
// temporary file is removed, so a failed run leaves no half-written output.
class WeightWriter {
 public:
  WeightWriter(const std::string& path, const ModelConfig& cfg, DType weight_dtype);
  ~WeightWriter();
  WeightWriter(const WeightWriter&) = delete;
  WeightWriter& operator=(const WeightWriter&) = delete;

  // The dtype a tensor is stored in: its spec's fixed dtype, else fp32 for vectors and the file's
  // weight dtype otherwise.
  DType stored_dtype(const TensorSpec& spec) const;

  // Creates the dataset (space allocated now, in call order) for rows to be written next.
  void create(const TensorSpec& spec);
  // Writes rows [row_begin, row_begin + n_rows) of the first dimension from `data` (of type
  // `data_type`, converted to the stored dtype on the way). Rows come in order (each call continues
  // where the last one of this tensor ended), so that the tensor's digest is taken on the way.
  void write_rows(const TensorSpec& spec, int64_t row_begin, int64_t n_rows, const void* data, DType data_type);
  // create() + write_rows() of the whole tensor.
  void write(const TensorSpec& spec, const void* data, DType data_type);

  void set_stage(const StageLayers& s);
  void set_attr(const std::string& name, const std::string& value);
  // The digest of a tensor written whole (throws otherwise); whether it was.
  uint64_t digest(const std::string& dataset) const;
  bool has_whole(const std::string& dataset) const;
  // The identity of the model this file belongs to (a stage file: the whole model's). Without it,
  // commit() computes it when the file holds every tensor of the model, else writes none. With it,
  // commit() checks every tensor written against its digest there.
  void set_identity(const ModelIdentity& id);
  // The model's text side (io/model_text.h), written at commit after every tensor, so that the
  // stages' byte ranges stay as they are.
  void set_text(const ModelText& text) { text_ = text; }
  void commit();  // text side, identity, flush, close, rename into place

  int64_t bytes_written() const { return bytes_written_; }

 private:
  struct Written {
    Xxh64 hash;
    int64_t rows = 0, total_rows = 0;
  };

  std::string path_;
  PendingFile pending_;  // before file_: the file is closed before its temporary name is removed
  ModelConfig cfg_;
  std::string config_json_;
  DType weight_dtype_;
  H5Handle file_;
  int64_t bytes_written_ = 0;
  std::map<std::string, Written> written_;
  std::optional<ModelIdentity> identity_;
  ModelText text_;
};

// Opens a weight file (whole model or one stage) read-only and reads datasets on demand, checking
// each one's shape against the name table. Counts the bytes it read from the file.
class WeightReader {
 public:
  explicit WeightReader(const std::string& path);

  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return weight_dtype_; }
  bool is_stage_file() const { return stage_.has_value_; }
  StageLayers stage() const { return stage_.info; }  // where a stage file sits in the pipeline

  bool has(const std::string& dataset) const;
  std::vector<int64_t> shape(const std::string& dataset) const;
  DType dtype(const std::string& dataset) const;
  int64_t storage_bytes(const std::string& dataset) const;

  // Reads the whole tensor into `out` as `want` (converting from the stored dtype). Throws if the
  // dataset is missing or its shape differs from spec.shape.
  void read(const TensorSpec& spec, void* out, DType want);
  // The same for rows [row_begin, row_begin + n_rows) of the first dimension.
  void read_rows(const TensorSpec& spec, int64_t row_begin, int64_t n_rows, void* out, DType want);
  std::vector<float> read_f32(const TensorSpec& spec);
  // Reads rows [row_begin, row_begin + n_rows) of the first dimension, stored dtype kept.
  void read_rows_raw(const std::string& dataset, int64_t row_begin, int64_t n_rows, void* out);

  int64_t bytes_read() const { return bytes_read_; }
  hid_t file() const { return file_.get(); }

  // The model's identity; nullopt for a file written by an older h5pack.
  const std::optional<ModelIdentity>& identity() const { return identity_; }
  // Whether reads check each tensor against its digest (default on where the file has digests): a
  // tensor read in row order from its first to its last row is hashed on the way and compared at
  // the end; a mismatch throws naming the tensor. Reads out of order are not checked.
  void set_verify(bool on) { verify_ = on; }
  // Tensors read whole and found equal to their digest so far.
  int64_t tensors_verified() const { return tensors_verified_; }
  // The digest a dataset must have (throws when the file has no identity or no such tensor).
  uint64_t expected_digest(const std::string& dataset) const;

 private:
  void check_digest(const std::string& dataset, int64_t row_begin, int64_t n_rows, int64_t total_rows,
                    const void* data, size_t bytes);

  struct Reading {
    Xxh64 hash;
    int64_t next_row = 0;
  };

  std::string path_;
  H5Handle file_;
  ModelConfig config_;
  DType weight_dtype_ = DType::F32;
  struct {
    bool has_value_ = false;
    StageLayers info;
  } stage_;
  int64_t bytes_read_ = 0;
  std::optional<ModelIdentity> identity_;
  std::map<std::string, size_t> tensor_index_;  // dataset path -> index in model_tensor_specs
  bool verify_ = true;
  std::map<std::string, Reading> reading_;
  int64_t tensors_verified_ = 0;
};

}  // namespace lfm2
