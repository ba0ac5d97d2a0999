// Per-sequence generation parameters in an inputs file (issue 20; docs/text.md "The inputs file"):
// optional datasets of length N beside input_ids, as vLLM's SamplingParams per request.
//
//   max_new_tokens  int32    temperature  float32    top_p  float32    top_k  int32    seed  int64
//
// -1 in any of them means "the run's flag decides" (--max-new-tokens, --temperature, ...). A block of
// rows is read as an HDF5 hyperslab, like the prompts; resolve() applies the flags and checks each
// value's range, naming the sequence by its row in the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lfm2 {

// One sequence's parameters after the flags' defaults are applied.
struct SeqSettings {
  int32_t max_new_tokens = 1;
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: every token
  float top_p = 1;
  uint64_t seed = 0;
};

// Rows [begin, end) of each dataset the file has (a missing one stays empty).
struct SeqParamsBlock {
  int64_t begin = 0, n = 0;
  std::vector<int32_t> max_new_tokens, top_k;
  std::vector<float> temperature, top_p;
  std::vector<int64_t> seed;

  bool any() const;
  // Whether any sequence's sampling (not only its max_new_tokens) differs from the flags'.
  bool own_sampling() const;
  // Row begin + i's settings, each -1 (or a missing dataset) taken from `flags`. Throws, naming the
  // sequence by its row and `path`, on a value out of range: max_new_tokens 1 .. 2^30, temperature
  // finite >= 0, top_p in (0, 1], top_k 0 .. 2^30, seed >= 0.
  SeqSettings resolve(int64_t i, const SeqSettings& flags, const std::string& path) const;
};

SeqParamsBlock read_seq_params(const std::string& path, int64_t begin, int64_t end);

// Adds the block's datasets (those it has, of length b.n = every sequence) to an existing inputs
// file (tests and tools).
void write_seq_params(const std::string& path, const SeqParamsBlock& b);

}  // namespace lfm2
