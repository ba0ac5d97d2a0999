// The partial output of a generation job (issue 20), plainly marked: "<output>.partial", an HDF5
// file whose root attribute `partial` is 1, beside the job's other attributes, and whose datasets
// grow as sequences finish (extendible, chunked), flushed at the job's cadence:
//
//   seq          int64 (M)     the sequences finished so far, in the order they finished
//   n_generated  int32 (M)     their tokens (EOS included)
//   generated    int32 (M, K)  their tokens; after the last, its EOS repeated, or -1 where the
//                              sequence stopped at its own max_new_tokens below K
//
// The journal (result_journal.h) is what --resume trusts; a resumed job writes this file afresh
// from it. The finished output replaces both.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/result_journal.h"

namespace lfm2 {

class PartialOutputs {
 public:
  // Creates `path` (replacing any) for rows of K tokens; `meta` becomes root attributes.
  PartialOutputs(const std::string& path, int64_t K, const nlohmann::json& meta);
  ~PartialOutputs();
  PartialOutputs(const PartialOutputs&) = delete;
  PartialOutputs& operator=(const PartialOutputs&) = delete;

  void append(const std::vector<JournalRecord>& records);
  void flush();
  int64_t rows() const { return rows_; }
  // Closes and deletes the file.
  void remove();

 private:
  std::string path_;
  int64_t K_ = 1, rows_ = 0;
  int64_t file_ = -1, seq_ = -1, n_ = -1, gen_ = -1;  // hid_t
};

// One row of `generated` for a sequence's tokens (K wide), padded as above.
std::vector<int32_t> generated_row(const JournalRecord& r, int64_t K);

// "<output>.partial"
std::string partial_path(const std::string& output);

}  // namespace lfm2
