// `h5pack verify`: every tensor read in row order through WeightReader, which hashes what it reads
// and compares each tensor's digest when its last row arrives.
#include "h5pack/verify.h"

#include <cmath>
#include <set>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/xxhash64.h"
#include "io/weight_file.h"

namespace lfm2 {
namespace {

int64_t count_nonfinite_stored(const void* data, DType t, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float v = 0;
    switch (t) {
      case DType::F32: v = static_cast<const float*>(data)[i]; break;
      case DType::BF16: v = bf16_to_float(static_cast<const uint16_t*>(data)[i]); break;
      case DType::F16: v = fp16_to_float(static_cast<const uint16_t*>(data)[i]); break;
      case DType::E4M3: v = e4m3_to_float(static_cast<const uint8_t*>(data)[i]); break;
    }
    bad += std::isfinite(v) ? 0 : 1;
  }
  return bad;
}

// The datasets the file must hold (a stage file: its stage's, its attributes checked against the
// model), none of the model's others present.
std::vector<TensorSpec> expected_specs(const WeightReader& reader, const std::string& path) {
  const ModelConfig& cfg = reader.config();
  std::vector<TensorSpec> want;
  if (reader.is_stage_file()) {
    const StageLayers s = reader.stage();
    LFM2_CHECK(s.n_stages >= 1 && s.stage >= 0 && s.stage < s.n_stages && s.layer_begin >= 0 &&
                   s.layer_begin < s.layer_end && s.layer_end <= cfg.num_hidden_layers,
               path, ": stage attributes (stage ", s.stage, " of ", s.n_stages, ", layers [", s.layer_begin, ", ",
               s.layer_end, ")) do not fit the model's ", cfg.num_hidden_layers, " layers");
    want = stage_tensor_specs(cfg, s);
  } else {
    want = model_tensor_specs(cfg);
  }
  std::set<std::string> wanted;
  for (const auto& spec : want) wanted.insert(spec.path);
  for (const auto& spec : model_tensor_specs(cfg))
    LFM2_CHECK(wanted.count(spec.path) || !reader.has(spec.path), path, ": dataset '", spec.path,
               "' does not belong in ", reader.is_stage_file() ? "this stage file" : "this file");
  return want;
}

// One dataset: present with its shape and dtype, read in blocks of about 64 MB (the reader checks
// its digest after the last row), FP8 scales checked, non-finite values counted into r.
void verify_tensor(WeightReader& reader, const std::string& path, const TensorSpec& spec, std::vector<char>& buf,
                   VerifyReport& r, Progress& prog) {
  LFM2_CHECK(reader.has(spec.path), path, ": dataset '", spec.path, "' is missing");
  const auto shape = reader.shape(spec.path);
  LFM2_CHECK(shape == spec.shape, path, ": dataset '", spec.path, "' does not have the shape config_json implies");
  const DType stored = reader.dtype(spec.path);
  const DType expect = stored_dtype(spec, reader.weight_dtype());
  LFM2_CHECK(stored == expect, path, ": dataset '", spec.path, "' is ", dtype_name(stored), ", expected ",
             dtype_name(expect));
  const int64_t row = spec.numel() / spec.shape[0];
  const int64_t row_bytes = row * int64_t(dtype_size(stored));
  const int64_t block = std::max<int64_t>(1, (int64_t(64) << 20) / row_bytes);
  const int64_t before = reader.tensors_verified();
  for (int64_t b = 0; b < spec.shape[0]; b += block) {
    const int64_t n = std::min(block, spec.shape[0] - b);
    buf.resize(size_t(n * row_bytes));
    reader.read_rows_raw(spec.path, b, n, buf.data());  // checks the digest after the last row
    if (is_fp8_scale_leaf(spec.path))
      check_fp8_scales(path, spec.path, reinterpret_cast<const float*>(buf.data()), n * row, b * row);
    const int64_t bad = count_nonfinite_stored(buf.data(), stored, n * row);
    if (bad && r.first_nonfinite.empty()) r.first_nonfinite = spec.path;
    r.nonfinite += bad;
    prog.advance(double(n * row));
  }
  LFM2_CHECK(reader.tensors_verified() == before + 1, path, ": tensor '", spec.path, "' was not checked");
  r.tensors += 1;
  r.bytes += spec.shape[0] * row_bytes;
}

}  // namespace

VerifyReport verify_weights(const std::string& path, bool progress) {
  const double t0 = now_s();
  WeightReader reader(path);
  LFM2_CHECK(reader.identity(), path,
             ": no model fingerprint or tensor digests to check against (written by an older h5pack; rewrite it with "
             "this h5pack's synth, convert or split)");
  const std::vector<TensorSpec> want = expected_specs(reader, path);
  VerifyReport r;
  r.fingerprint = hex64(reader.identity()->fingerprint);
  double total = 0;
  for (const auto& spec : want) total += double(spec.numel());
  Progress prog(cat("verify ", path), total, progress && total > double(int64_t(64) << 20));
  std::vector<char> buf;
  for (const auto& spec : want) verify_tensor(reader, path, spec, buf, r, prog);
  prog.finish();
  const ModelText text = read_model_text(reader.file(), path);  // checks every digest
  r.text_files = int64_t(text.files.size());
  if (!text.empty()) r.text_fingerprint = hex64(text_fingerprint(text));
  r.seconds = now_s() - t0;
  return r;
}

}  // namespace lfm2
