// `h5pack synth`: parallel, portable generation of random weights (see synth.h).
#include "h5pack/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/parallel.h"
#include "common/rng.h"
#include "io/weight_file.h"

namespace lfm2 {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

template <typename Store>
void fill_range(const CounterRng& rng, double offset, float unit_scale, uint64_t begin, uint64_t n, Store store) {
  // units * unit_scale is exact in double (24-bit integer times 24-bit mantissa), so the value
  // below has exactly one rounding (to double), then one to float, whatever the compiler contracts.
  for (uint64_t i = 0; i < n; ++i) {
    double v = offset + double(rng.symmetric_units(begin + i)) * double(unit_scale);
    store(i, float(v));
  }
}

constexpr uint64_t kBlockElems = uint64_t(16) << 20;  // elements generated per write

// The output's file system must hold `bytes` (and a little for HDF5's metadata).
void check_free_space(const std::string& out, double bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::space_info space = fs::space(fs::absolute(out).parent_path(), ec);
  if (ec) return;  // cannot tell: the write itself will say
  const double need = bytes * 1.001 + double(1 << 20);
  char text[96];
  std::snprintf(text, sizeof text, "%.2f GiB, and %.2f GiB are free there", need / double(1 << 30),
                double(space.available) / double(1 << 30));
  LFM2_CHECK(need <= double(space.available), out, ": the model needs ", text);
}

}  // namespace

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

SynthInit synth_init(const ModelConfig& cfg, const TensorSpec& spec) {
  const std::string& p = spec.path;
  const double sqrt3 = std::sqrt(3.0);
  if (spec.is_vector()) {
    if (ends_with(p, "expert_bias")) return {0.0, 0.05};
    return {1.0, 0.1};  // RMSNorm weights
  }
  if (p == names::kEmbedTokens) return {0.0, sqrt3};
  // Every linear weight, output projections included, has std 1/sqrt(fan_in). Shrinking out_proj
  // and w2 by 1/sqrt(2 * n_layers) was tried and rejected: the residual stream then stays the
  // embedding, and the tied head predicts the input token for every sample (lfm2-mini, measured
  // with transformers), which would make top-1 checks blind to the layers. At full scale the
  // residual RMS grows from 1 to about 4.7 over 24 layers and top-1 depends on every layer.
  (void)cfg;
  const double fan_in = double(spec.shape.back());
  return {0.0, sqrt3 / std::sqrt(fan_in)};
}

void synth_fill(void* dst, DType dtype, uint64_t seed, const TensorSpec& spec, const SynthInit& init, uint64_t begin,
                uint64_t n, int threads) {
  const CounterRng rng(seed, fnv1a64(spec.path));
  const float unit_scale = float(init.scale / 16777216.0);
  auto part = [&](uint64_t b, uint64_t e) {
    switch (dtype) {
      case DType::F32: {
        float* out = static_cast<float*>(dst) + b;
        fill_range(rng, init.offset, unit_scale, begin + b, e - b, [out](uint64_t i, float v) { out[i] = v; });
        break;
      }
      case DType::BF16: {
        uint16_t* out = static_cast<uint16_t*>(dst) + b;
        fill_range(rng, init.offset, unit_scale, begin + b, e - b,
                   [out](uint64_t i, float v) { out[i] = float_to_bf16(v); });
        break;
      }
      case DType::F16: {
        uint16_t* out = static_cast<uint16_t*>(dst) + b;
        fill_range(rng, init.offset, unit_scale, begin + b, e - b,
                   [out](uint64_t i, float v) { out[i] = float_to_fp16(v); });
        break;
      }
      case DType::E4M3: LFM2_FAIL("synth: e4m3 is no weight dtype (synth bf16, then h5pack quantize)");
    }
  };
  // Small blocks run inline; the chunks are contiguous, so the bytes do not depend on the split.
  parallel_for(int64_t(n), std::max(1, threads), [&](int64_t b, int64_t e, int) { part(uint64_t(b), uint64_t(e)); },
               65536);
}

void synth_weights(const ModelConfig& cfg, const std::string& out, const SynthOptions& opt) {
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const auto specs = model_tensor_specs(cfg);
  double total = 0;  // matrices in opt.dtype, vectors in fp32 (WeightWriter::stored_dtype)
  for (const auto& s : specs) total += double(s.numel()) * double(dtype_size(s.is_vector() ? DType::F32 : opt.dtype));
  WeightWriter writer(out, cfg, opt.dtype);  // can the file be made at all (a clearer error first)
  check_free_space(out, total);               // then, before minutes of work, is there room for it
  writer.set_attr("source", cat("h5pack synth --seed ", opt.seed, " --dtype ", dtype_name(opt.dtype)));
  writer.set_text(opt.text);
  Progress progress(cat("synth ", out, " (", cfg.total_params(), " parameters, ", threads, " threads)"), total,
                    opt.progress);

  // Double buffering: one block is written (HDF5, on a helper thread) while the next is generated.
  std::vector<char> buffers[2];
  int cur = 0;
  std::future<void> pending;
  for (const auto& spec : specs) {
    if (pending.valid()) pending.get();  // HDF5 calls never overlap
    writer.create(spec);
    const DType stored = writer.stored_dtype(spec);
    const SynthInit init = synth_init(cfg, spec);
    const uint64_t row = uint64_t(spec.numel() / spec.shape[0]);
    const int64_t step = int64_t(std::max<uint64_t>(1, kBlockElems / row));
    for (int64_t r = 0; r < spec.shape[0]; r += step) {
      const int64_t n_rows = std::min(step, spec.shape[0] - r);
      const uint64_t n = uint64_t(n_rows) * row;
      auto& buf = buffers[cur];
      buf.resize(n * dtype_size(stored));
      synth_fill(buf.data(), stored, opt.seed, spec, init, uint64_t(r) * row, n, threads);
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&writer, &spec, r, n_rows, &buf, stored] {
        h5_quiet();
        writer.write_rows(spec, r, n_rows, buf.data(), stored);
      });
      cur ^= 1;
      progress.advance(double(n * dtype_size(stored)));
    }
  }
  if (pending.valid()) pending.get();
  writer.commit();
  progress.finish();
}

}  // namespace lfm2
