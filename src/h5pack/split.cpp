// `h5pack split`: copies each stage's datasets, in row blocks, into its own weight file.
#include "h5pack/split.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common/log.h"
#include "common/output_guard.h"
#include "common/xxhash64.h"
#include "io/weight_file.h"
#include "plan/layer_partition.h"

namespace lfm2 {

std::string stage_path(const std::string& pattern, int stage) {
  const size_t p = pattern.find("%d");
  LFM2_CHECK(p != std::string::npos && pattern.find('%', p + 2) == std::string::npos &&
                 pattern.find('%') == p,
             pattern, ": output pattern needs exactly one %d (e.g. stage-%d.h5) and no other '%'");
  return pattern.substr(0, p) + std::to_string(stage) + pattern.substr(p + 2);
}

namespace {

// Each stage's output: no directory, no input; replacing a file is said.
std::vector<std::string> stage_outputs(const std::vector<StageLayers>& stages, const std::string& pattern,
                                       const std::string& in) {
  std::vector<std::string> outs;
  for (const auto& p : stages) outs.push_back(stage_path(pattern, p.stage));
  for (const auto& out : outs) {
    LFM2_CHECK(!std::filesystem::is_directory(out), out, ": is a directory (give the stage files' pattern)");
    check_output_is_no_input({"OUT_PATTERN", out}, {{"input", in}});
    const std::string note = replacing_note(out);
    if (!note.empty()) log_info(note);
  }
  return outs;
}

// One stage's datasets, checked against the config, copied in row blocks of about 64 MiB.
void copy_stage(WeightReader& reader, const std::string& in, const StageLayers& stage, WeightWriter& w,
                const std::string& out, bool progress) {
  const ModelConfig& cfg = reader.config();
  const auto specs = stage_tensor_specs(cfg, stage);
  double total = 0;
  for (const auto& s : specs) total += double(s.numel());
  Progress prog(cat("split: stage ", stage.stage, " (layers ", stage.layer_begin, "..", stage.layer_end - 1, ") -> ", out),
                total, progress);
  std::vector<char> buf;
  for (const auto& spec : specs) {
    LFM2_CHECK(reader.has(spec.path), in, ": dataset '", spec.path, "' is missing");
    LFM2_CHECK(reader.shape(spec.path) == spec.shape, in, ": dataset '", spec.path,
               "' does not have the shape config_json implies");
    const DType stored = reader.dtype(spec.path);
    LFM2_CHECK(stored == w.stored_dtype(spec), in, ": dataset '", spec.path, "' is ", dtype_name(stored),
               ", expected ", dtype_name(w.stored_dtype(spec)));
    w.create(spec);
    const uint64_t row_bytes = uint64_t(spec.numel() / spec.shape[0]) * dtype_size(stored);
    const int64_t block = int64_t(std::max<uint64_t>(1, (uint64_t(64) << 20) / row_bytes));
    for (int64_t r = 0; r < spec.shape[0]; r += block) {
      const int64_t n = std::min(block, spec.shape[0] - r);
      buf.resize(size_t(uint64_t(n) * row_bytes));
      reader.read_rows_raw(spec.path, r, n, buf.data());
      w.write_rows(spec, r, n, buf.data(), stored);
      prog.advance(double(spec.numel() / spec.shape[0] * n));
    }
  }
  prog.finish();
}

// Every stage file carries the whole model's identity: the input's (each copied tensor is checked
// against its digest there at commit), or, for an input from an older h5pack, the one its tensors
// give, every tensor having been copied into some stage.
ModelIdentity whole_model_identity(const WeightReader& reader, const std::string& in,
                                   const std::vector<std::unique_ptr<WeightWriter>>& writers, bool progress) {
  if (reader.identity()) return *reader.identity();
  const ModelConfig& cfg = reader.config();
  ModelIdentity id;
  const auto specs = model_tensor_specs(cfg);
  for (const auto& spec : specs) {
    auto w = std::find_if(writers.begin(), writers.end(), [&](const auto& wr) { return wr->has_whole(spec.path); });
    LFM2_CHECK(w != writers.end(), in, ": tensor '", spec.path, "' is in no stage");
    id.tensor_digests.push_back((*w)->digest(spec.path));
  }
  id.fingerprint = model_fingerprint(cfg.to_json_text(), reader.weight_dtype(), specs, id.tensor_digests);
  if (progress)
    log_info(cat(in, " has no model fingerprint (an older h5pack): computed ", hex64(id.fingerprint),
                 " from its tensors"));
  return id;
}

}  // namespace

std::vector<std::string> split_weights(const std::string& in, int n_stages, const std::string& pattern,
                                       const std::string& layers, bool progress) {
  stage_path(pattern, 0);  // validate before any work
  WeightReader reader(in);
  LFM2_CHECK(!reader.is_stage_file(), in, ": is already a stage file (stage ", reader.stage().stage, " of ",
             reader.stage().n_stages, "); split the whole-model file");
  const ModelConfig& cfg = reader.config();
  LFM2_CHECK(n_stages >= 1 && n_stages <= cfg.num_hidden_layers, in, ": cannot split ", cfg.num_hidden_layers,
             " layers into ", n_stages, " stages");
  const auto stages = layers.empty() ? default_stages(cfg, n_stages)
                                    : make_stages(parse_layer_counts(layers, int(cfg.num_hidden_layers), n_stages));
  const std::vector<std::string> outs = stage_outputs(stages, pattern, in);
  // The text side goes to every stage: the first rank encodes prompts, the last decides where a
  // sequence ends (EOS) and writes the results, and a node may hold only its own stage's file.
  const ModelText text = read_model_text(reader.file(), in);
  std::vector<std::unique_ptr<WeightWriter>> writers;
  for (const auto& stage : stages) {
    const std::string& out = outs[size_t(stage.stage)];
    writers.push_back(std::make_unique<WeightWriter>(out, cfg, reader.weight_dtype()));
    WeightWriter& w = *writers.back();
    w.set_stage(stage);
    w.set_attr("source", cat("h5pack split ", in));
    w.set_text(text);
    copy_stage(reader, in, stage, w, out, progress);
  }
  const ModelIdentity id = whole_model_identity(reader, in, writers, progress);
  for (auto& w : writers) w->set_identity(id);
  // Every file is complete: rename all into place; if one rename fails, take back the ones done.
  for (size_t i = 0; i < writers.size(); ++i) {
    try {
      writers[i]->commit();
    } catch (...) {
      for (size_t k = 0; k < i; ++k) std::remove(outs[k].c_str());
      throw;
    }
  }
  return outs;
}

}  // namespace lfm2
