// `h5pack inspect`: reads a weight file's attributes and dataset metadata (never its data).
#include "h5pack/inspect.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/xxhash64.h"
#include "io/weight_file.h"
#include "plan/layer_partition.h"

namespace lfm2 {

namespace {
// n with a decimal prefix: "8.34 B", "16.68 GB"; `units` names 1e9, 1e6, 1e3 and 1 in that order.
std::string with_prefix(int64_t n, const char* const (&units)[4]) {
  char buf[32];
  const double v = double(n);
  const double scale[3] = {1e9, 1e6, 1e3};
  for (int i = 0; i < 3; ++i)
    if (v >= scale[i]) {
      std::snprintf(buf, sizeof buf, "%.2f%s", v / scale[i], units[i]);
      return buf;
    }
  std::snprintf(buf, sizeof buf, "%lld%s", static_cast<long long>(n), units[3]);
  return buf;
}
// A dataset's shape, dtype, bytes and place in the file (-1: not contiguous, or not allocated).
InspectDataset inspect_dataset(const WeightReader& reader, const std::string& name) {
  InspectDataset d;
  d.path = name;
  d.shape = reader.shape(name);
  d.dtype = reader.dtype(name);
  d.bytes = reader.storage_bytes(name);
  H5Handle dset(H5Dopen2(reader.file(), name.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), reader.path(), ": opening dataset ", name);
  haddr_t off = H5Dget_offset(dset.get());
  d.offset = off == HADDR_UNDEF ? -1 : int64_t(off);
  return d;
}

// What a stage of the default split holds (parameters, bytes as stored) and the byte range of the
// file it reads, when every one of its datasets has a place (r.datasets).
InspectStage inspect_stage(const InspectReport& r, const StageLayers& stage) {
  InspectStage s{stage.stage, stage.layer_begin, stage.layer_end, 0, 0, -1, -1};
  bool all_present = true;
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& spec : stage_tensor_specs(r.config, stage)) {
    if (!is_fp8_scale_leaf(spec.path)) s.params += spec.numel();
    const DType t = stored_dtype(spec, r.weight_dtype);
    s.bytes += spec.numel() * int64_t(dtype_size(t));
    auto it = std::find_if(r.datasets.begin(), r.datasets.end(),
                           [&](const InspectDataset& d) { return d.path == spec.path; });
    if (it == r.datasets.end() || it->offset < 0) {
      all_present = false;
      continue;
    }
    // The tied embedding of the last stage sits at the file's start: count the layer range only.
    if (spec.path == names::kEmbedTokens && !stage.is_first()) continue;
    lo = std::min(lo, it->offset);
    hi = std::max(hi, it->offset + it->bytes);
  }
  if (all_present) {
    s.file_begin = lo;
    s.file_end = hi;
  }
  return s;
}

}  // namespace

std::string human_count(int64_t n) { return with_prefix(n, {" B", " M", " K", ""}); }

std::string human_bytes(int64_t n) { return with_prefix(n, {" GB", " MB", " kB", " B"}); }

InspectReport inspect_weights(const std::string& path, int n_stages) {
  WeightReader reader(path);
  InspectReport r;
  r.path = path;
  r.config = reader.config();
  r.weight_dtype = reader.weight_dtype();
  r.is_stage_file = reader.is_stage_file();
  if (reader.identity()) r.fingerprint = hex64(reader.identity()->fingerprint);
  if (r.is_stage_file) {
    r.stage = reader.stage().stage;
    r.n_stages = reader.stage().n_stages;
    r.layer_begin = reader.stage().layer_begin;
    r.layer_end = reader.stage().layer_end;
  }
  r.model_params = r.config.total_params();
  // Metadata only: the text side is read (a few MB at most) but its digests are verify's to check.
  const ModelText text = read_model_text(reader.file(), path, false);
  for (const auto& [name, bytes] : text.files) r.text_files.push_back(cat(name, " (", bytes.size(), " bytes)"));
  if (!text.empty()) {
    r.text_fingerprint = hex64(text_fingerprint(text));
    r.tokenizer = summarize_tokenizer(text);
    r.generation = generation_defaults(text);
  }
  for (const auto& spec : model_tensor_specs(r.config)) {
    if (!reader.has(spec.path)) continue;
    InspectDataset d = inspect_dataset(reader, spec.path);
    int64_t n = 1;
    for (auto x : d.shape) n *= x;
    if (!is_fp8_scale_leaf(spec.path)) r.file_params += n;  // scales are no parameters of the model
    r.file_bytes += d.bytes;
    r.datasets.push_back(std::move(d));
  }
  LFM2_CHECK(n_stages >= 0, path, ": --stages ", n_stages, " must be positive");
  if (n_stages > 0) {
    LFM2_CHECK(n_stages <= r.config.num_hidden_layers, path, ": cannot split ", r.config.num_hidden_layers,
               " layers into ", n_stages, " stages");
    for (const auto& stage : default_stages(r.config, n_stages)) r.stages.push_back(inspect_stage(r, stage));
  }
  return r;
}

namespace {

// "text side: ..." lines: the tokenizer, the chat template, the generation defaults.
std::string format_text_side(const InspectReport& r) {
  if (r.text_files.empty())
    return "text side: none (no tokenizer: converted from a checkpoint without one, synthesized, or an older h5pack)\n";
  std::ostringstream os;
  const TokenizerSummary& t = r.tokenizer;
  os << "text side: " << r.text_files.size() << " files, text fingerprint " << r.text_fingerprint
     << " (not part of the model fingerprint)\n";
  for (const auto& f : r.text_files) os << "  " << f << "\n";
  if (t.has_tokenizer)
    os << "tokenizer: " << t.model_type << ", vocab " << t.vocab_size << " (" << t.added_tokens << " added tokens, "
       << t.special_tokens << " special)" << (t.vocab_size > r.config.vocab_size ? ", MORE than the model's vocab" : "")
       << (t.bos_token.empty() ? "" : ", bos " + t.bos_token) << (t.eos_token.empty() ? "" : ", eos " + t.eos_token)
       << "\n";
  else
    os << "tokenizer: none (no tokenizer.json: prompts must come as token ids)\n";
  if (t.template_bytes > 0)
    os << "chat template: " << t.template_bytes << " bytes (" << t.template_source << ")";
  else
    os << "chat template: none";
  for (size_t i = 0; i < t.template_names.size(); ++i) os << (i ? ", " : "; also named: ") << t.template_names[i];
  os << "\n";
  const GenerationDefaults& g = r.generation;
  std::string eos;
  for (const int32_t id : g.eos_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
  os << "generation defaults: eos " << (eos.empty() ? std::string("none") : eos + " (" + g.eos_source + ")");
  if (g.do_sample) os << ", sampling";
  if (g.temperature) os << ", temperature " << *g.temperature;
  if (g.top_k) os << ", top_k " << *g.top_k;
  if (g.top_p) os << ", top_p " << *g.top_p;
  if (g.max_new_tokens) os << ", max_new_tokens " << *g.max_new_tokens;
  os << "\n";
  return os.str();
}

}  // namespace

std::string format_report(const InspectReport& r, bool brief) {
  std::ostringstream os;
  const ModelConfig& c = r.config;
  os << r.path << ": lfm2-rank weight file, weights " << dtype_name(r.weight_dtype) << " (vectors fp32)\n";
  if (c.fp8.on)
    os << "fp8: e4m3 " << (c.fp8.projections ? "experts and dense/attention/conv projections" : "experts")
       << ", fp32 scales " << (c.fp8.scheme == Fp8Scheme::Channel ? "per output channel" : "per 128 x 128 block")
       << " (<matrix>_scale); embedding, norms, router and head " << dtype_name(r.weight_dtype) << "\n";
  if (r.is_stage_file)
    os << "stage file: stage " << r.stage << " of " << r.n_stages << ", layers " << r.layer_begin << ".."
       << r.layer_end - 1 << "\n";
  os << "model fingerprint: "
     << (r.fingerprint.empty() ? std::string("none (written by an older h5pack)")
                               : r.fingerprint + " (config and every tensor; h5pack verify checks the data)")
     << "\n";
  std::string attn;
  for (int il = 0; il < c.num_hidden_layers; ++il)
    if (c.is_attention(il)) attn += (attn.empty() ? "" : ",") + std::to_string(il);
  os << "config: vocab " << c.vocab_size << ", hidden " << c.hidden_size << ", layers " << c.num_hidden_layers
     << " (attention at " << attn << "), heads " << c.num_attention_heads << "/" << c.num_key_value_heads
     << " kv, head_dim " << c.head_dim() << ", dense layers " << c.num_dense_layers << " (intermediate "
     << c.intermediate_size << "), experts " << c.num_experts << " top-" << c.num_experts_per_tok
     << " (intermediate " << c.moe_intermediate_size << "), rope_theta " << c.rope_theta << ", norm_eps "
     << c.norm_eps << ", " << (c.tie_word_embeddings ? "tied" : "untied") << " head\n";
  os << format_text_side(r);
  if (!brief) {
    os << "datasets (" << r.datasets.size() << "):\n";
    for (const auto& d : r.datasets) {
      std::string shape = "(";
      for (size_t i = 0; i < d.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(d.shape[i]);
      shape += ")";
      char line[256];
      std::snprintf(line, sizeof line, "  %-34s %-20s %-5s %12lld bytes at %lld\n", d.path.c_str(), shape.c_str(),
                    dtype_name(d.dtype), static_cast<long long>(d.bytes), static_cast<long long>(d.offset));
      os << line;
    }
  } else {
    os << "datasets: " << r.datasets.size() << "\n";
  }
  os << "parameters: " << human_count(r.file_params) << " (" << r.file_params << ") in this file";
  if (r.file_params != r.model_params) os << ", " << human_count(r.model_params) << " (" << r.model_params << ") in the model";
  os << "\n";
  os << "data bytes: " << human_bytes(r.file_bytes) << " (" << r.file_bytes << ")\n";
  if (!r.stages.empty()) {
    os << "stages (" << r.stages.size() << ", balanced split):\n";
    for (const auto& s : r.stages) {
      os << "  stage " << s.stage << ": layers " << s.layer_begin << ".." << s.layer_end - 1 << ", "
         << human_count(s.params) << " parameters, reads " << human_bytes(s.bytes) << " (" << s.bytes << " bytes)";
      if (s.file_begin >= 0) os << ", file bytes [" << s.file_begin << ", " << s.file_end << ")";
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace lfm2
