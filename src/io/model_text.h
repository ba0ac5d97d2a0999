// The text side of a model: the checkpoint's tokenizer, chat template and generation defaults,
// stored verbatim in the weight file (docs/weight-format.md, "The text side").
//
// `h5pack convert` takes the files below from the checkpoint directory when present and stores each
// as a 1-D uint8 dataset `text/<name>` holding its exact bytes, with its XXH64 digest (attribute
// `xxh64`, 16 hex digits), and the root attribute `text_fingerprint` over all of them. `h5pack split`
// copies them into every stage file. Files without them (older h5pack, `synth`, a checkpoint without
// a tokenizer) read as an empty ModelText. The model fingerprint (io/model_identity.h) leaves the
// text out: it names what the numbers depend on, and a corrected chat template changes no logit.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lfm2 {

// The files of the text side, in the order they are stored and fingerprinted.
const std::vector<std::string>& text_file_names();

struct ModelText {
  std::map<std::string, std::string> files;  // name -> exact bytes
  bool empty() const { return files.empty(); }
  bool has(const std::string& name) const { return files.count(name) > 0; }
  const std::string& at(const std::string& name) const { return files.at(name); }
};

// The text files present in a checkpoint directory (regular files only; at most 256 MiB each).
// Throws naming the file for one that is not a regular file or cannot be read.
ModelText read_text_files(const std::string& dir);

// Checks the files a reader will parse: the JSON files are JSON objects, tokenizer.json has a
// model with a vocabulary, generation_config's eos_token_id is an id or a list of ids in
// [0, vocab_size). Throws "<name>: <problem>" for the first problem; returns warnings (the
// tokenizer's ids reach past the model's vocabulary).
std::vector<std::string> check_model_text(const ModelText& text, int64_t vocab_size);

// XXH64 of "lfm2-rank text fingerprint 1\n" then "<name> <xxh64 of its bytes, 16 hex>\n" per file in
// text_file_names() order; 0 for an empty ModelText.
uint64_t text_fingerprint(const ModelText& text);

// Writes the group `text`, one dataset per file with its digest, and the root attribute
// `text_fingerprint`. Nothing for an empty ModelText.
void write_model_text(hid_t file, const ModelText& text);

// Reads the text side of an open weight file (empty when it has none). With `verify`, each file is
// checked against its digest and the set against text_fingerprint (a mismatch throws: "the file is
// damaged"); a dataset under text/ of an unknown name is refused either way.
ModelText read_model_text(hid_t file, const std::string& where, bool verify = true);
// The same from a weight or stage file's path.
ModelText read_model_text(const std::string& weight_file, bool verify = true);

// What generation_config.json (else tokenizer_config.json) says a generation should default to.
struct GenerationDefaults {
  std::vector<int32_t> eos_ids;  // generation_config eos_token_id, else the tokenizer's eos_token
  std::string eos_source;        // "generation_config.json", "tokenizer_config.json" or ""
  std::optional<int32_t> bos_id, pad_id;
  bool do_sample = false;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k, max_new_tokens;
};
GenerationDefaults generation_defaults(const ModelText& text);

// What `h5pack inspect` shows of the tokenizer and the chat template.
struct TokenizerSummary {
  bool has_tokenizer = false;
  std::string model_type;          // BPE, Unigram, WordPiece, WordLevel
  int64_t vocab_size = 0;          // largest id + 1, added tokens included
  int64_t added_tokens = 0, special_tokens = 0;
  std::string bos_token, eos_token;                 // tokenizer_config's, "" when absent
  int64_t template_bytes = 0;                       // the default chat template, 0 when none
  std::string template_source;                      // "chat_template.jinja" or "tokenizer_config.json"
  std::vector<std::string> template_names;          // named templates beside the default
};
TokenizerSummary summarize_tokenizer(const ModelText& text);

// The id of a token string in tokenizer.json (added tokens first, then the model's vocabulary).
std::optional<int32_t> token_id(const ModelText& text, const std::string& token);

}  // namespace lfm2
