// The CUDA stage (bf16) on an FP8 file, its weights dequantized at upload (model/weight_upload.h),
// against the CPU stage's weights-only oracle on the same file (docs/fp8.md). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "h5pack/presets.h"
#include "h5pack/quantize.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "model/cuda_stage.h"
#include "model/stage_executor.h"

namespace lfm2 {
namespace {

using namespace test;

// Both schemes, every projection quantized: the bf16 stage tolerance of docs/cuda-backend.md.
class CudaFp8Stage : public CudaTest {};

TEST_F(CudaFp8Stage, Bf16StageOnFp8FileMatchesCpuOracle) {
  const std::string dir = std::string(LFM2_CUDA_TEST_WORK_DIR);
  std::filesystem::create_directories(dir);
  SynthOptions so;
  so.seed = 21;
  so.progress = false;
  synth_weights(synth_preset("lfm2-tiny"), dir + "/fp8_src.h5", so);
  for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
    const std::string path = cat(dir, "/fp8_", fp8_scheme_name(scheme), ".h5");
    QuantizeOptions qo;
    qo.scheme = scheme;
    qo.projections = true;
    quantize_weights(dir + "/fp8_src.h5", path, qo);
    WeightReader reader(path);
    const ModelConfig& cfg = reader.config();
    const int64_t n_seq = 3, seq_len = 70, n_tok = n_seq * seq_len, V = cfg.vocab_size;
    std::vector<int32_t> ids(static_cast<size_t>(n_tok));
    for (int64_t i = 0; i < n_tok; ++i) ids[size_t(i)] = int32_t((i * 37 + 11) % V);
    const StageLayers whole = whole_model(int(cfg.num_hidden_layers));
    std::vector<float> ref(static_cast<size_t>(n_tok * V)), got(ref.size());
    {
      auto cpu = make_cpu_stage(reader, whole, 2);
      float* x = static_cast<float*>(cpu->alloc_hidden(n_tok));
      cpu->embed(ids.data(), n_seq, seq_len, x);
      cpu->forward(x, n_seq, seq_len);
      HeadOutputs h;
      h.all_logits = ref.data();
      cpu->head(x, n_seq, seq_len, nullptr, h);
    }
    {
      auto gpu = make_cuda_stage(reader, whole, DType::BF16, 0, false, false, 0);
      void* x = gpu->alloc_hidden(n_tok);
      gpu->embed(ids.data(), n_seq, seq_len, x);
      gpu->forward(x, n_seq, seq_len);
      HeadOutputs h;
      h.all_logits = got.data();
      gpu->head(x, n_seq, seq_len, nullptr, h);
      gpu->synchronize();
    }
    double num = 0, den = 0;
    int64_t agree = 0;
    for (int64_t r = 0; r < n_tok; ++r) {
      const float* p = ref.data() + r * V;
      const float* q = got.data() + r * V;
      agree += (std::max_element(p, p + V) - p) == (std::max_element(q, q + V) - q);
      for (int64_t i = 0; i < V; ++i) num += double(q[i] - p[i]) * (q[i] - p[i]), den += double(p[i]) * p[i];
    }
    const double rel = std::sqrt(num / den), top1 = double(agree) / double(n_tok);
    std::printf("[fp8 stage] %s: bf16 GPU vs CPU oracle: rel %.4f, top-1 %.3f\n", fp8_scheme_name(scheme), rel, top1);
    EXPECT_LE(rel, 0.1);
    EXPECT_GE(top1, 0.9);
  }
}

}  // namespace
}  // namespace lfm2
