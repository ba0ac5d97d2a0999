// `h5pack inspect`: what a weight file holds: config, datasets (shape, dtype, file offset),
// parameter count, the bytes each pipeline stage reads, and the text side (tokenizer, chat
// template, EOS ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/model_config.h"
#include "io/model_text.h"

namespace lfm2 {

struct InspectDataset {
  std::string path;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t bytes = 0;
  int64_t offset = -1;  // byte offset in the file (contiguous datasets), -1 if unknown
};

struct InspectStage {
  int stage = 0, layer_begin = 0, layer_end = 0;
  int64_t params = 0, bytes = 0;
  int64_t file_begin = -1, file_end = -1;  // byte range of its datasets in this file (-1: not all present)
};

struct InspectReport {
  std::string path;
  ModelConfig config;
  DType weight_dtype = DType::F32;
  std::string fingerprint;  // 16 hex digits, "" for a file of an older h5pack
  bool is_stage_file = false;
  int stage = 0, n_stages = 1, layer_begin = 0, layer_end = 0;
  std::vector<InspectDataset> datasets;  // name-table order
  int64_t file_params = 0;               // elements of the datasets present
  int64_t model_params = 0;              // config.total_params()
  int64_t file_bytes = 0;                // sum of dataset bytes
  std::vector<InspectStage> stages;      // when asked for n_stages > 0
  std::vector<std::string> text_files;   // the text side's files (io/model_text.h), empty without one
  std::string text_fingerprint;          // 16 hex digits, "" without a text side
  TokenizerSummary tokenizer;
  GenerationDefaults generation;
};

InspectReport inspect_weights(const std::string& path, int n_stages = 0);
// Human-readable text (all datasets listed unless `brief`).
std::string format_report(const InspectReport& r, bool brief = false);
// "8.34 B", "40.1 M", "512 K".
std::string human_count(int64_t n);
// "16.68 GB" (decimal units).
std::string human_bytes(int64_t n);

}  // namespace lfm2
