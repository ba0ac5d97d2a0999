// `h5pack quantize`: walks the output's name table (the input's plus a scale after each quantized
// matrix), quantizing matrix by matrix (one expert at a time) and copying the rest in row blocks.
#include "h5pack/quantize.h"

#include <algorithm>
#include <vector>

#include "common/log.h"
#include "io/weight_file.h"

namespace lfm2 {
namespace {

// One quantized matrix spec (a stack of n_mat (rows, cols) matrices): each read as fp32, quantized,
// its e4m3 rows written; then its scale dataset.
void quantize_tensor(WeightReader& reader, WeightWriter& w, const TensorSpec& spec, const TensorSpec& scale_spec,
                     Fp8Scheme scheme, Progress& prog) {
  const size_t nd = spec.shape.size();
  const int64_t rows = spec.shape[nd - 2], cols = spec.shape[nd - 1], n_mat = spec.numel() / (rows * cols);
  const int64_t per_mat = scale_spec.numel() / n_mat;
  std::vector<float> m(size_t(rows * cols)), scale(size_t(scale_spec.numel()));
  std::vector<uint8_t> q(size_t(rows * cols));
  w.create(spec);
  for (int64_t b = 0; b < n_mat; ++b) {
    // A stack (E, rows, cols) is read one matrix (one row of its first dimension) at a time.
    if (nd == 3)
      reader.read_rows(spec, b, 1, m.data(), DType::F32);
    else
      reader.read(spec, m.data(), DType::F32);
    fp8_quantize(q.data(), scale.data() + b * per_mat, m.data(), rows, cols, scheme);
    if (nd == 3)
      w.write_rows(spec, b, 1, q.data(), DType::E4M3);
    else
      w.write_rows(spec, 0, rows, q.data(), DType::E4M3);
    prog.advance(double(rows * cols));
  }
  w.write(scale_spec, scale.data(), DType::F32);
}

// A tensor copied in its stored dtype, in row blocks of about 64 MiB.
void copy_tensor(WeightReader& reader, WeightWriter& w, const TensorSpec& spec, Progress& prog) {
  const DType stored = reader.dtype(spec.path);
  LFM2_CHECK(stored == w.stored_dtype(spec), reader.path(), ": dataset '", spec.path, "' is ", dtype_name(stored),
             ", expected ", dtype_name(w.stored_dtype(spec)));
  w.create(spec);
  const int64_t row = spec.numel() / spec.shape[0];
  const int64_t block = std::max<int64_t>(1, (int64_t(64) << 20) / (row * int64_t(dtype_size(stored))));
  std::vector<char> buf;
  for (int64_t r = 0; r < spec.shape[0]; r += block) {
    const int64_t n = std::min(block, spec.shape[0] - r);
    buf.resize(size_t(n * row) * dtype_size(stored));
    reader.read_rows_raw(spec.path, r, n, buf.data());
    w.write_rows(spec, r, n, buf.data(), stored);
    prog.advance(double(n * row));
  }
}

}  // namespace

void quantize_weights(const std::string& in, const std::string& out, const QuantizeOptions& opt) {
  WeightReader reader(in);
  LFM2_CHECK(!reader.is_stage_file(), in, ": is a stage file; quantize the whole-model file, then split");
  LFM2_CHECK(!reader.config().fp8.on, in, ": is already an fp8 file (", fp8_scheme_name(reader.config().fp8.scheme),
             ")");
  ModelConfig cfg = reader.config();
  cfg.fp8.on = true;
  cfg.fp8.scheme = opt.scheme;
  cfg.fp8.projections = opt.projections;
  const std::vector<TensorSpec> specs = model_tensor_specs(cfg);
  for (const auto& spec : specs) {
    if (is_fp8_scale_leaf(spec.path)) continue;
    LFM2_CHECK(reader.has(spec.path), in, ": dataset '", spec.path, "' is missing");
    LFM2_CHECK(reader.shape(spec.path) == spec.shape, in, ": dataset '", spec.path,
               "' does not have the shape config_json implies");
  }
  const ModelText text = read_model_text(reader.file(), in);
  WeightWriter w(out, cfg, reader.weight_dtype());
  w.set_attr("source", !opt.source.empty() ? opt.source
                                            : cat("h5pack quantize --fp8 --scheme ", fp8_scheme_name(opt.scheme),
                                                  opt.projections ? " --dense " : " ", in));
  w.set_text(text);
  double total = 0;
  for (const auto& s : specs) total += double(s.numel());
  Progress prog(cat("quantize ", in, " -> ", out), total, opt.progress && total > double(int64_t(64) << 20));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].dtype == DType::E4M3) {
      quantize_tensor(reader, w, specs[i], specs.at(i + 1), opt.scheme, prog);
      ++i;  // its scale, written with it
    } else {
      copy_tensor(reader, w, specs[i], prog);
    }
  }
  prog.finish();
  w.commit();  // every tensor written: the identity is computed from what was written
}

}  // namespace lfm2
