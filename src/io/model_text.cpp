// The text side of a weight file: the checkpoint's tokenizer and generation files, verbatim, with
// digests (format in docs/weight-format.md, "The text side").
#include "io/model_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_kind.h"
#include "common/xxhash64.h"
#include "io/h5_util.h"

namespace lfm2 {
namespace {

using nlohmann::json;

constexpr const char* kTextGroup = "text";
constexpr const char* kDigestAttr = "xxh64";
constexpr const char* kFingerprintAttr = "text_fingerprint";
constexpr uint64_t kMaxTextBytes = uint64_t(256) << 20;

// Parses one of the JSON files; throws naming it.
json parse_json(const ModelText& text, const std::string& name) {
  try {
    json j = json::parse(text.at(name));
    LFM2_CHECK(j.is_object(), name, ": is JSON but not an object");
    return j;
  } catch (const json::parse_error& e) {
    LFM2_FAIL(name, ": not JSON (", e.what(), ")");
  }
}

// The ids of tokenizer.json: the model's vocabulary (an object token -> id, or Unigram's list of
// [piece, score] where the id is the index) and the added tokens.
struct TokenizerIds {
  std::string model_type;
  int64_t max_id = -1, added = 0, special = 0;
};

TokenizerIds tokenizer_ids(const json& tok) {
  TokenizerIds t;
  LFM2_CHECK(tok.contains("model") && tok["model"].is_object() && tok["model"].contains("vocab"),
             "tokenizer.json: has no model with a vocabulary (not a Hugging Face tokenizers file)");
  const json& model = tok["model"];
  t.model_type = model.value("type", std::string("?"));
  const json& vocab = model["vocab"];
  if (vocab.is_object()) {
    for (const auto& [token, id] : vocab.items()) {
      LFM2_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "tokenizer.json: vocabulary entry '", token,
                 "' has no id >= 0");
      t.max_id = std::max(t.max_id, id.get<int64_t>());
    }
  } else {
    LFM2_CHECK(vocab.is_array(), "tokenizer.json: the model's vocab is neither an object nor a list");
    t.max_id = int64_t(vocab.size()) - 1;
  }
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& a : tok["added_tokens"]) {
      LFM2_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0,
                 "tokenizer.json: an added token without an id >= 0");
      t.max_id = std::max(t.max_id, a["id"].get<int64_t>());
      t.added += 1;
      t.special += a.value("special", false) ? 1 : 0;
    }
  }
  return t;
}

// eos_token_id of generation_config.json: an id, a list of ids, or null / absent.
std::vector<int32_t> eos_ids_of(const json& gen, int64_t vocab_size) {
  std::vector<int32_t> ids;
  if (!gen.contains("eos_token_id") || gen["eos_token_id"].is_null()) return ids;
  const json& e = gen["eos_token_id"];
  const json list = e.is_array() ? e : json::array({e});
  for (const json& id : list) {
    LFM2_CHECK(id.is_number_integer(), "generation_config.json: eos_token_id holds ", id.dump(), ", not a token id");
    const int64_t v = id.get<int64_t>();
    LFM2_CHECK(v >= 0 && (vocab_size <= 0 || v < vocab_size), "generation_config.json: eos_token_id ", v,
               " is outside the model's vocabulary [0, ", vocab_size, ")");
    ids.push_back(int32_t(v));
  }
  return ids;
}

// A special token of tokenizer_config.json: a string or {"content": ...}.
std::string token_text(const json& cfg, const std::string& key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

std::string read_whole(const std::string& path) {
  check_input_file("checkpoint file", path);  // never open a FIFO
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  LFM2_CHECK(!ec, path, ": ", ec.message());
  LFM2_CHECK(size <= kMaxTextBytes, path, ": ", size, " bytes; a text file of the model may hold at most ",
             kMaxTextBytes);
  std::ifstream in(path, std::ios::binary);
  LFM2_CHECK(in.good(), path, ": cannot open");
  std::string bytes(size, '\0');
  in.read(bytes.data(), std::streamsize(size));
  LFM2_CHECK(in.gcount() == std::streamsize(size), path, ": short read");
  return bytes;
}

uint64_t digest_of(const std::string& bytes) { return xxh64(bytes.data(), bytes.size()); }

void write_one(hid_t group, const std::string& name, const std::string& bytes) {
  const hsize_t n = bytes.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr));
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "text/", name);
  H5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0), "text/", name);  // reproducible files
  H5Handle dset(H5Dcreate2(group, name.c_str(), H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  H5_CHECK(dset.get(), "creating dataset text/", name);
  if (n > 0)
    H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), "writing text/",
             name);
  h5_write_attr(dset.get(), kDigestAttr, hex64(digest_of(bytes)));
}

std::string read_one(hid_t group, const std::string& where, const std::string& name, bool verify) {
  H5Handle dset(H5Dopen2(group, name.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), where, ": opening text/", name);
  H5Handle type(H5Dget_type(dset.get()));
  const std::vector<int64_t> shape = h5_dataset_shape(dset.get());
  LFM2_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 1 && shape.size() == 1, where,
             ": text/", name, " is not a 1-D dataset of bytes");
  std::string bytes(size_t(shape[0]), '\0');
  if (!bytes.empty())
    H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), where,
             ": reading text/", name);
  if (verify) {
    const std::string want = h5_read_attr_string(dset.get(), kDigestAttr, where + ": text/" + name);
    LFM2_CHECK(want == hex64(digest_of(bytes)), where, ": text/", name, " does not match its digest (read ",
               hex64(digest_of(bytes)), ", recorded ", want, "): the file is damaged");
  }
  return bytes;
}

}  // namespace

const std::vector<std::string>& text_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json", "tokenizer_config.json",
                                                 "special_tokens_map.json", "generation_config.json",
                                                 "chat_template.jinja"};
  return names;
}

ModelText read_text_files(const std::string& dir) {
  ModelText text;
  for (const std::string& name : text_file_names()) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (path_kind(path, false) == "missing") continue;
    text.files[name] = read_whole(path);
  }
  return text;
}

std::vector<std::string> check_model_text(const ModelText& text, int64_t vocab_size) {
  std::vector<std::string> warnings;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (text.has(name)) parse_json(text, name);
  if (text.has("tokenizer_config.json")) {
    const json cfg = parse_json(text, "tokenizer_config.json");
    if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
      const json& t = cfg["chat_template"];
      bool ok = t.is_string() || t.is_array();
      if (t.is_array())
        for (const json& e : t)
          ok = ok && e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
               e["template"].is_string();
      LFM2_CHECK(ok, "tokenizer_config.json: chat_template is neither a string nor a list of {name, template}");
    }
  }
  if (text.has("generation_config.json")) eos_ids_of(parse_json(text, "generation_config.json"), vocab_size);
  if (text.has("tokenizer.json")) {
    const TokenizerIds t = tokenizer_ids(parse_json(text, "tokenizer.json"));
    if (vocab_size > 0 && t.max_id >= vocab_size)
      warnings.push_back(cat("tokenizer.json: ids reach ", t.max_id, ", past the model's vocabulary [0, ", vocab_size,
                             "): prompts holding them will be refused"));
  }
  return warnings;
}

uint64_t text_fingerprint(const ModelText& text) {
  if (text.empty()) return 0;
  std::string s = "lfm2-rank text fingerprint 1\n";
  for (const std::string& name : text_file_names())
    if (text.has(name)) s += name + " " + hex64(digest_of(text.at(name))) + "\n";
  return xxh64(s.data(), s.size());
}

void write_model_text(hid_t file, const ModelText& text) {
  if (text.empty()) return;
  for (const auto& [name, bytes] : text.files) {
    (void)bytes;
    const auto& known = text_file_names();
    LFM2_CHECK(std::find(known.begin(), known.end(), name) != known.end(), "text file '", name,
               "' is not one of the model's text files");
  }
  H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5_CHECK(H5Pset_obj_track_times(gcpl.get(), 0), "creating group text");
  H5Handle group(H5Gcreate2(file, kTextGroup, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
  H5_CHECK(group.get(), "creating group text");
  for (const std::string& name : text_file_names())
    if (text.has(name)) write_one(group.get(), name, text.at(name));
  h5_write_attr(file, kFingerprintAttr, hex64(text_fingerprint(text)));
}

ModelText read_model_text(hid_t file, const std::string& where, bool verify) {
  ModelText text;
  const bool has_group = H5Lexists(file, kTextGroup, H5P_DEFAULT) > 0, has_fp = h5_has_attr(file, kFingerprintAttr);
  if (!has_group && !has_fp) return text;
  LFM2_CHECK(has_group && has_fp, where, ": has ", has_group ? "a text group" : "a text_fingerprint", " but not ",
             has_group ? "a text_fingerprint" : "a text group", " (a damaged file)");
  H5Handle group(H5Gopen2(file, kTextGroup, H5P_DEFAULT));
  H5_CHECK(group.get(), where, ": opening group text");
  H5G_info_t info;
  H5_CHECK(H5Gget_info(group.get(), &info), where, ": group text");
  const auto& known = text_file_names();
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {};
    H5_CHECK(H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT),
             where, ": group text");
    LFM2_CHECK(std::find(known.begin(), known.end(), name) != known.end(), where, ": text/", name,
               " is not one of the model's text files");
    text.files[name] = read_one(group.get(), where, name, verify);
  }
  if (verify) {
    const std::string want = h5_read_attr_string(file, kFingerprintAttr, where);
    LFM2_CHECK(want == hex64(text_fingerprint(text)), where, ": text_fingerprint ", want,
               " does not match the text files it stands for (", hex64(text_fingerprint(text)), "): a damaged file");
  }
  return text;
}

ModelText read_model_text(const std::string& weight_file, bool verify) {
  h5_quiet();
  check_input_file("weight file", weight_file);
  LFM2_CHECK(H5Fis_hdf5(weight_file.c_str()) > 0, weight_file, ": not an HDF5 file (or truncated)");
  H5Handle f(H5Fopen(weight_file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5_CHECK(f.get(), weight_file, ": cannot open");
  return read_model_text(f.get(), weight_file, verify);
}

GenerationDefaults generation_defaults(const ModelText& text) {
  GenerationDefaults d;
  if (text.has("generation_config.json")) {
    const json gen = parse_json(text, "generation_config.json");
    d.eos_ids = eos_ids_of(gen, 0);
    if (!d.eos_ids.empty()) d.eos_source = "generation_config.json";
    auto id = [&](const char* key) -> std::optional<int32_t> {
      if (gen.contains(key) && gen[key].is_number_integer()) return int32_t(gen[key].get<int64_t>());
      return std::nullopt;
    };
    d.bos_id = id("bos_token_id");
    d.pad_id = id("pad_token_id");
    d.do_sample = gen.value("do_sample", false);
    if (gen.contains("temperature") && gen["temperature"].is_number()) d.temperature = gen["temperature"].get<double>();
    if (gen.contains("top_p") && gen["top_p"].is_number()) d.top_p = gen["top_p"].get<double>();
    if (gen.contains("top_k") && gen["top_k"].is_number_integer()) d.top_k = gen["top_k"].get<int64_t>();
    if (gen.contains("max_new_tokens") && gen["max_new_tokens"].is_number_integer())
      d.max_new_tokens = gen["max_new_tokens"].get<int64_t>();
  }
  if (d.eos_ids.empty() && text.has("tokenizer_config.json") && text.has("tokenizer.json")) {
    const std::string eos = token_text(parse_json(text, "tokenizer_config.json"), "eos_token");
    if (const auto id = eos.empty() ? std::nullopt : token_id(text, eos)) {
      d.eos_ids = {*id};
      d.eos_source = "tokenizer_config.json";
    }
  }
  return d;
}

TokenizerSummary summarize_tokenizer(const ModelText& text) {
  TokenizerSummary s;
  if (text.has("tokenizer.json")) {
    const TokenizerIds t = tokenizer_ids(parse_json(text, "tokenizer.json"));
    s.has_tokenizer = true;
    s.model_type = t.model_type;
    s.vocab_size = t.max_id + 1;
    s.added_tokens = t.added;
    s.special_tokens = t.special;
  }
  json cfg = json::object();
  if (text.has("tokenizer_config.json")) cfg = parse_json(text, "tokenizer_config.json");
  s.bos_token = token_text(cfg, "bos_token");
  s.eos_token = token_text(cfg, "eos_token");
  // transformers: chat_template.jinja, when present, takes priority over the config's entry.
  if (text.has("chat_template.jinja")) {
    s.template_bytes = int64_t(text.at("chat_template.jinja").size());
    s.template_source = "chat_template.jinja";
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    s.template_bytes = int64_t(cfg["chat_template"].get<std::string>().size());
    s.template_source = "tokenizer_config.json";
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const json& e : cfg["chat_template"]) {
      const std::string name = e.value("name", std::string());
      if (name == "default") {
        s.template_bytes = int64_t(e.value("template", std::string()).size());
        s.template_source = "tokenizer_config.json";
      } else {
        s.template_names.push_back(name);
      }
    }
  }
  return s;
}

std::optional<int32_t> token_id(const ModelText& text, const std::string& token) {
  if (!text.has("tokenizer.json")) return std::nullopt;
  const json tok = parse_json(text, "tokenizer.json");
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (const json& a : tok["added_tokens"])
      if (a.value("content", std::string()) == token && a.contains("id") && a["id"].is_number_integer())
        return int32_t(a["id"].get<int64_t>());
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object()) {
    const json& vocab = tok["model"]["vocab"];
    const auto it = vocab.find(token);
    if (it != vocab.end() && it->is_number_integer()) return int32_t(it->get<int64_t>());
  }
  return std::nullopt;
}

}  // namespace lfm2
