// Token files of lfm2-rank: inputs, answers and outputs (HDF5, SPEC §2).
//
//   inputs   input_ids   int32 (N, S)     token ids, N sequences of S tokens (right-padded)
//            lengths     int32 (N)        optional: sequence i is input_ids[i, :lengths[i]]
//   answers  next_token  int32 (N)        top-1 of each sequence's last position
//            logits      float32 (N, V)   that position's logits (optional)
//            generated   int32 (N, K)     greedy continuation (optional)
//   outputs  the answers' datasets, plus margin float32 (N) (the top-1 logit minus the runner-up's),
//            all_logits float32 (N, S, V) with --all-logits, and run metadata as root attributes;
//            written under a temporary name and renamed into place.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lfm2 {

struct TokenInputs {
  int64_t n_seq = 0, seq_len = 0;
  std::vector<int32_t> ids;      // (N, S), row-major
  std::vector<int32_t> lengths;  // (N), or empty: every row is full
  int32_t length(int64_t i) const { return lengths.empty() ? int32_t(seq_len) : lengths[size_t(i)]; }
};

struct TokenAnswers {
  int64_t n_seq = 0, vocab = 0;     // vocab 0 when there are no logits
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> logits;        // (N, V) or empty
  int64_t n_new = 0;                // K: generated tokens per sequence (0 without `generated`)
  std::vector<int32_t> generated;   // (N, K) or empty
  bool has_logits() const { return !logits.empty(); }
};

// Reads input_ids (any integer type, converted to int32) and lengths when present. Throws a
// one-line error for a missing or unreadable file, a missing dataset, a non-integer type, a rank
// other than 2, an empty shape, or lengths of the wrong shape or outside [1, S].
TokenInputs read_inputs(const std::string& path);
// The same checks, reading only the shape and the lengths (ids stays empty).
TokenInputs read_inputs_header(const std::string& path);
// Rows [begin, end) of input_ids, only their first `width` columns (an HDF5 hyperslab: nothing else
// of the file is read), and their lengths (each at most `width`). Replicas
// read their own block of sequences this way (src/plan/replica_work.h).
TokenInputs read_inputs_block(const std::string& path, int64_t begin, int64_t end, int64_t width);

// Checks S <= max_positions.
void check_input_shape(const TokenInputs& in, int64_t max_positions, const std::string& path);
// Checks the shape and that every id of every prompt (padding is never read) is in [0, vocab);
// throws naming the first offender by its row in the file (`first_row`: the file's row of in's
// row 0, for a block).
void check_inputs(const TokenInputs& in, int64_t vocab, int64_t max_positions, const std::string& path,
                  int64_t first_row = 0);

// Sets every padding id (past a sequence's length) to 0, so that nothing downstream reads a value
// nobody checked; the positions' results are never used.
void zero_padding(TokenInputs& in);

// The datasets tools/lfm2_text.py encode writes into an inputs file beside input_ids for its decode
// (request_id, stop, lengths, max_new_tokens); a generation's --output copies them.
const std::vector<std::string>& request_datasets();

// What an inputs file says of the front end that made it: the first of request_datasets() it lacks
// ("" when it has them all) and its text_fingerprint attribute (the tokenizer's; "" when absent).
struct InputsProvenance {
  std::string missing_dataset;
  std::string text_fingerprint;
};
InputsProvenance read_inputs_provenance(const std::string& path);

// Reads next_token and, when present, logits.
TokenAnswers read_answers(const std::string& path);

// Checks the answers fit inputs of n_seq sequences and a vocabulary of `vocab`.
void check_answers(const TokenAnswers& ans, int64_t n_seq, int64_t vocab, const std::string& path);

struct TokenOutputs {
  int64_t n_seq = 0, seq_len = 0, vocab = 0;
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> logits;        // (N, V) last position, or empty
  std::vector<float> margin;        // (N) top-1 minus runner-up logit, or empty
  std::vector<float> all_logits;    // (N, S, V) or empty
  int64_t n_new = 0;                // K
  std::vector<int32_t> generated;   // (N, K) generated tokens (after EOS: the EOS id repeated), or empty
  std::vector<int32_t> n_generated; // (N) tokens generated per sequence (EOS included), or empty
  // Datasets copied as they are from another file (the inputs: request_id, stop, lengths,
  // max_new_tokens of tools/lfm2_text.py encode, so that its decode needs the outputs alone);
  // names the file lacks are skipped.
  std::string copy_from;
  std::vector<std::string> copy_datasets;
};

// Writes outputs atomically (path + ".tmp.<pid>", then rename); `metadata` (a JSON object of
// strings, integers, floats and booleans) becomes root attributes.
void write_outputs(const std::string& path, const TokenOutputs& out, const nlohmann::json& metadata);

// Writes an inputs file (tests and tools; atomic as above).
void write_inputs(const std::string& path, const TokenInputs& in);

// Reads an outputs file back (next_token, logits and all_logits when present).
TokenOutputs read_outputs(const std::string& path);

}  // namespace lfm2
