// `h5pack convert`: plan (validate every source tensor), then stream it into a weight file.
#include "h5pack/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <filesystem>
#include <set>
#include <vector>

#include "common/log.h"
#include "common/output_guard.h"
#include "common/shape_text.h"
#include "io/safetensors.h"
#include "io/weight_file.h"

namespace lfm2 {
namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

// Rows [dst_row, dst_row + n_rows) of a dataset come from elements starting at src_elem of a source tensor.
struct Piece {
  std::string src;
  int64_t dst_row = 0, n_rows = 0;
  uint64_t src_elem = 0;
};

struct Step {
  TensorSpec spec;
  std::vector<Piece> pieces;
};

class Planner {
 public:
  explicit Planner(const SafetensorsCheckpoint& ck) : ck_(ck) {}

  // Checks `name` exists with shape `want` and marks it used.
  const SafeTensorInfo& take(const std::string& name, const std::vector<int64_t>& want) {
    LFM2_CHECK(ck_.has(name), ck_.path(), ": tensor '", name, "' is missing (config.json expects it with shape ",
               shape_list(want), ")");
    const auto& t = ck_.info(name);
    LFM2_CHECK(t.shape == want, t.file, ": tensor '", name, "' has shape ", shape_list(t.shape),
               " but config.json implies ", shape_list(want));
    LFM2_CHECK(used_.insert(name).second, t.file, ": tensor '", name, "' used twice");
    return t;
  }

  Step plan(const TensorSpec& spec) {
    Step step{spec, {}};
    const int64_t rows = spec.shape[0];
    if (spec.hf_name.find("{e}") == std::string::npos) {
      std::vector<int64_t> want = spec.shape;
      if (spec.path.size() >= 10 && spec.path.compare(spec.path.size() - 10, 10, "/conv/conv") == 0)
        want = {spec.shape[0], 1, spec.shape[1]};  // HF (H, 1, L), stored (H, L)
      take(spec.hf_name, want);
      step.pieces.push_back({spec.hf_name, 0, rows, 0});
      return step;
    }
    // Stacked experts: (E, Im, H) for w1 / w3, (E, H, Im) for w2.
    const std::string prefix = spec.hf_name.substr(0, spec.hf_name.find("{e}"));  // "...feed_forward.experts."
    const std::string leaf = spec.path.substr(spec.path.rfind('/') + 1);           // w1, w2, w3
    const int64_t E = spec.shape[0], a = spec.shape[1], b = spec.shape[2];
    const std::string fused = prefix + (leaf == "w2" ? "down_proj" : "gate_up_proj");
    const bool per_expert = ck_.has(replace_all(spec.hf_name, "{e}", "0"));
    LFM2_CHECK(per_expert || !is_fp8_scale_leaf(spec.path), ck_.path(), ": tensor '",
               replace_all(spec.hf_name, "{e}", "0"), "' is missing (fp8 scales are read per expert)");
    LFM2_CHECK(!(per_expert && ck_.has(fused)), ck_.info(fused).file, ": both '", fused, "' and per-expert '",
               replace_all(spec.hf_name, "{e}", "0"), "' are present");
    if (per_expert || !ck_.has(fused)) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string name = replace_all(spec.hf_name, "{e}", std::to_string(e));
        take(name, {a, b});
        step.pieces.push_back({name, e, 1, 0});
      }
    } else if (leaf == "w2") {
      take(fused, {E, a, b});
      step.pieces.push_back({fused, 0, E, 0});
    } else {
      // gate_up_proj (E, 2*Im, H): expert e's rows [0, Im) are w1 (gate), [Im, 2*Im) are w3 (up).
      if (!used_.count(fused)) take(fused, {E, 2 * a, b});
      const uint64_t half = uint64_t(a * b);
      for (int64_t e = 0; e < E; ++e)
        step.pieces.push_back({fused, e, 1, uint64_t(e) * 2 * half + (leaf == "w3" ? half : 0)});
    }
    return step;
  }

  void check_all_used() const {
    std::vector<std::string> extra;
    for (const auto& n : ck_.names())
      if (!used_.count(n)) extra.push_back(n);
    if (extra.empty()) return;
    const auto& first = ck_.info(extra[0]);
    std::string hint;
    if (extra[0] == "lm_head.weight") hint = " (config.json has tie_word_embeddings = true: the head is the embedding)";
    LFM2_FAIL(first.file, ": tensor '", extra[0], "' is not part of the model config.json describes", hint,
              extra.size() > 1 ? cat(" (and ", extra.size() - 1, " more unexpected tensors)") : std::string());
  }

 private:
  const SafetensorsCheckpoint& ck_;
  std::set<std::string> used_;
};

constexpr uint64_t kBlockBytes = uint64_t(64) << 20;

// Finite values that fp16 cannot hold (|x| >= 65520 rounds to inf).
uint64_t count_fp16_overflow(const void* data, DType t, uint64_t n) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float v = t == DType::F32 ? static_cast<const float*>(data)[i]
                                    : bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    count += std::isfinite(v) && std::fabs(v) >= 65520.0f;
  }
  return count;
}

// "text side: tokenizer.json (BPE, vocab 65536), chat template (4123 bytes), eos 7, 2 (generation_config.json)".
std::string text_side_line(const ModelText& text) {
  if (text.empty()) return "text side: none (no tokenizer.json, tokenizer_config.json or generation_config.json)";
  const TokenizerSummary t = summarize_tokenizer(text);
  const GenerationDefaults g = generation_defaults(text);
  std::string line = "text side: ";
  line += t.has_tokenizer ? cat("tokenizer.json (", t.model_type, ", vocab ", t.vocab_size, ")") : "no tokenizer.json";
  line += t.template_bytes > 0 ? cat(", chat template (", t.template_bytes, " bytes)") : ", no chat template";
  std::string eos;
  for (const int32_t id : g.eos_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
  line += eos.empty() ? ", no eos id" : cat(", eos ", eos, " (", g.eos_source, ")");
  return line;
}

// A published FP8 checkpoint (config quantization_config, HF's keys only) quantizes either every
// projection or only the experts: which one, its layer 0's first projection says (a mix is refused
// by the plan: scales missing or left over).
ModelConfig with_fp8_modules(ModelConfig cfg, const SafetensorsCheckpoint& ck) {
  if (!cfg.fp8.on) return cfg;
  const std::string first = cfg.is_attention(0) ? "model.layers.0.self_attn.q_proj.weight_scale_inv"
                                                : "model.layers.0.conv.in_proj.weight_scale_inv";
  cfg.fp8.projections = ck.has(first);
  return cfg;
}

// A source tensor's dtype against what the file stores: e4m3 only into an fp8 matrix (its scale
// comes with it), and an fp8 matrix only from e4m3 (quantizing is `h5pack quantize`'s job).
void check_fp8_source(const SafeTensorInfo& src, const TensorSpec& spec, DType stored) {
  LFM2_CHECK((src.dtype == DType::E4M3) == (stored == DType::E4M3), src.file, ": tensor '", src.name, "' is ",
             safetensors_dtype_name(src.dtype), " but ", spec.path, " is stored ", dtype_name(stored),
             stored == DType::E4M3 ? " (config.json's quantization_config says fp8; convert the bf16 checkpoint, then "
                                     "h5pack quantize)"
                                   : " (an F8_E4M3 tensor needs quantization_config fp8 in config.json)");
}

// A step's pieces into the file, in blocks of about kBlockBytes: FP8 scales checked, values past
// fp16's range counted per source tensor (the warnings after the commit).
struct PieceCopy {
  const SafetensorsCheckpoint& ck;
  WeightWriter& writer;
  Progress& prog;
  std::vector<char> buf;
  std::map<std::string, uint64_t> overflow;  // source tensor -> values that round to +-inf in fp16

  void run(const TensorSpec& spec, const Piece& piece) {
    const auto& src = ck.info(piece.src);
    check_fp8_source(src, spec, writer.stored_dtype(spec));
    const uint64_t row = uint64_t(spec.numel() / spec.shape[0]), es = dtype_size(src.dtype);
    const int64_t block = int64_t(std::max<uint64_t>(1, kBlockBytes / (row * es)));
    for (int64_t r = 0; r < piece.n_rows; r += block) {
      const int64_t n = std::min(block, piece.n_rows - r);
      buf.resize(size_t(uint64_t(n) * row * es));
      ck.read_elements(piece.src, piece.src_elem + uint64_t(r) * row, uint64_t(n) * row, buf.data());
      if (is_fp8_scale_leaf(spec.path)) {
        LFM2_CHECK(src.dtype == DType::F32, src.file, ": tensor '", piece.src, "' is ",
                   safetensors_dtype_name(src.dtype), " (fp8 scales are F32)");
        check_fp8_scales(src.file, piece.src, reinterpret_cast<const float*>(buf.data()), int64_t(n * row),
                         int64_t(r * row));
      }
      if (writer.stored_dtype(spec) == DType::F16 && src.dtype != DType::F16)
        overflow[piece.src] += count_fp16_overflow(buf.data(), src.dtype, uint64_t(n) * row);
      writer.write_rows(spec, piece.dst_row + r, n, buf.data(), src.dtype);
      prog.advance(double(uint64_t(n) * row));
    }
  }
};

}  // namespace

void convert_checkpoint(const std::string& dir, const std::string& out, std::optional<DType> dtype, bool progress) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  LFM2_CHECK(fs::is_directory(dir), dir, ": not a checkpoint directory");
  LFM2_CHECK(fs::exists(config_path), config_path, ": missing (a checkpoint directory holds config.json)");
  const SafetensorsCheckpoint ck(dir);
  const ModelConfig cfg = with_fp8_modules(ModelConfig::from_file(config_path), ck);
  std::vector<NamedPath> inputs = {{"config.json of the checkpoint", config_path}};
  for (const auto& f : ck.files()) inputs.push_back({"checkpoint file", f});
  inputs.push_back({"checkpoint index", (fs::path(dir) / "model.safetensors.index.json").string()});
  for (const auto& name : text_file_names()) inputs.push_back({"checkpoint file", (fs::path(dir) / name).string()});
  check_output_is_no_input({"OUT", out}, inputs);
  // The text side (tokenizer, chat template, generation defaults), checked before any work.
  const ModelText text = read_text_files(dir);
  std::vector<std::string> text_warnings;
  try {
    text_warnings = check_model_text(text, cfg.vocab_size);
  } catch (const Error& e) {
    throw Error(cat((fs::path(dir) / "").string(), e.what()));  // "DIR/generation_config.json: ..."
  }

  Planner planner(ck);
  std::vector<Step> steps;
  for (const auto& spec : model_tensor_specs(cfg)) steps.push_back(planner.plan(spec));
  planner.check_all_used();

  const DType weight_dtype = dtype ? *dtype : ck.info(embed_spec(cfg).hf_name).dtype;
  WeightWriter writer(out, cfg, weight_dtype);
  writer.set_attr("source", cat("h5pack convert ", fs::absolute(dir).lexically_normal().string()));
  writer.set_text(text);
  double total = 0;
  for (const auto& s : steps) total += double(s.spec.numel());
  Progress prog(cat("convert ", dir, " -> ", out), total, progress);

  PieceCopy copy{ck, writer, prog, {}, {}};
  for (const auto& step : steps) {
    writer.create(step.spec);
    for (const auto& piece : step.pieces) copy.run(step.spec, piece);
  }
  writer.commit();
  prog.finish();
  for (const auto& w : text_warnings)
    std::fprintf(stderr, "%swarning: %s/%s\n", log_prefix().c_str(), dir.c_str(), w.c_str());
  if (progress) log_info(text_side_line(text));
  for (const auto& [name, count] : copy.overflow)
    if (count > 0)
      std::fprintf(stderr, "%swarning: %s: tensor '%s': %llu values beyond the fp16 range became +-inf\n",
                   log_prefix().c_str(), ck.info(name).file.c_str(), name.c_str(),
                   static_cast<unsigned long long>(count));
}

}  // namespace lfm2
