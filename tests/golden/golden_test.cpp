// Golden tests: the CPU StageExecutor against Hugging Face transformers (Lfm2MoeForCausalLM).
//
// For each committed case under tests/golden/data/<case>/ (written by tools/make_goldens.py):
// convert the checkpoint with h5pack, run embed -> all layers -> head on the CPU and compare with
// HF's logits: relative error max|d| / max|ref| per sample <= 1e-5 and identical top-1, for the
// last position and for every position. Then the same run split into 2-3 stages back to back,
// and with another thread count, must be bit-identical.
#include <gtest/gtest.h>

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "h5pack/convert.h"
#include "io/h5_util.h"
#include "io/weight_file.h"
#include "kernels/argmax.h"
#include "kernels/rope.h"
#include "model/stage_executor.h"

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTol = 1e-5;

struct Golden {
  int64_t n_seq = 0, seq_len = 0, vocab = 0;
  std::vector<int32_t> input_ids;   // (N, S)
  std::vector<float> logits;        // (N, V) last position
  std::vector<float> logits_all;    // (N, S, V)
  std::vector<int32_t> next_token;  // (N)
  std::vector<float> inv_freq;      // (hd/2)
};

template <typename T>
std::vector<T> read_dataset(hid_t file, const std::string& name, hid_t mem_type, std::vector<int64_t>* shape) {
  H5Handle d(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  H5_CHECK(d.get(), "golden.h5: opening ", name);
  *shape = h5_dataset_shape(d.get());
  int64_t n = 1;
  for (auto s : *shape) n *= s;
  std::vector<T> out(static_cast<size_t>(n));
  H5_CHECK(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "golden.h5: reading ", name);
  return out;
}

Golden read_golden(const std::string& path) {
  h5_quiet();
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5_CHECK(f.get(), path, ": opening");
  Golden g;
  std::vector<int64_t> shape;
  g.input_ids = read_dataset<int32_t>(f.get(), "input_ids", H5T_NATIVE_INT32, &shape);
  g.n_seq = shape.at(0);
  g.seq_len = shape.at(1);
  g.logits = read_dataset<float>(f.get(), "logits", H5T_NATIVE_FLOAT, &shape);
  g.vocab = shape.at(1);
  g.logits_all = read_dataset<float>(f.get(), "logits_all", H5T_NATIVE_FLOAT, &shape);
  g.next_token = read_dataset<int32_t>(f.get(), "next_token", H5T_NATIVE_INT32, &shape);
  g.inv_freq = read_dataset<float>(f.get(), "inv_freq", H5T_NATIVE_FLOAT, &shape);
  return g;
}

struct Logits {
  std::vector<float> last, all;  // (N, V), (N*S, V)
};

// embed -> layers of each range in turn -> head, the hidden state handed from stage to stage by
// copy, as the pipeline does.
Logits run_stages(WeightReader& reader, const std::vector<StageLayers>& stages, const Golden& g, int n_threads) {
  const int64_t T = g.n_seq * g.seq_len, H = reader.config().hidden_size;
  Logits out;
  out.last.resize(size_t(g.n_seq * g.vocab));
  out.all.resize(size_t(T * g.vocab));
  std::vector<float> carried(size_t(T * H));
  for (const StageLayers& r : stages) {
    auto stage = make_cpu_stage(reader, r, n_threads);
    float* x = static_cast<float*>(stage->alloc_hidden(T));
    if (r.is_first())
      stage->embed(g.input_ids.data(), g.n_seq, g.seq_len, x);
    else
      std::memcpy(x, carried.data(), carried.size() * sizeof(float));
    stage->forward(x, g.n_seq, g.seq_len);
    stage->synchronize();
    if (r.is_last()) {
      HeadOutputs head;
      head.logits = out.last.data();
      head.all_logits = out.all.data();
      stage->head(x, g.n_seq, g.seq_len, nullptr, head);
    } else {
      std::memcpy(carried.data(), x, carried.size() * sizeof(float));
    }
  }
  return out;
}

// max over samples of max|d| / max|ref|, each sample being `per_sample` consecutive values.
double max_rel_error(const std::vector<float>& got, const std::vector<float>& ref, int64_t n_samples,
                     int64_t per_sample, double* max_abs) {
  double worst = 0;
  *max_abs = 0;
  for (int64_t s = 0; s < n_samples; ++s) {
    double d = 0, m = 0;
    for (int64_t i = s * per_sample; i < (s + 1) * per_sample; ++i) {
      d = std::max(d, std::fabs(double(got[size_t(i)]) - double(ref[size_t(i)])));
      m = std::max(m, std::fabs(double(ref[size_t(i)])));
    }
    *max_abs = std::max(*max_abs, d);
    worst = std::max(worst, d / m);
  }
  return worst;
}

std::vector<int32_t> top1(const std::vector<float>& logits, int64_t n_rows, int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n_rows));
  cpu::argmax(out.data(), logits.data(), n_rows, vocab);
  return out;
}

std::string converted_path(const std::string& name, const std::string& suffix) {
  fs::path dir = fs::path(LFM2_GOLDEN_WORK_DIR);
  fs::create_directories(dir);
  return (dir / (name + suffix + ".h5")).string();
}

class GoldenCase : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return std::string(LFM2_GOLDEN_DATA_DIR) + "/" + GetParam(); }
};

TEST_P(GoldenCase, MatchesTransformers) {
  const std::string name = GetParam();
  const Golden g = read_golden(dir() + "/golden.h5");
  const std::string h5 = converted_path(name, "");
  convert_checkpoint(dir(), h5, std::nullopt);
  WeightReader reader(h5);
  const ModelConfig& cfg = reader.config();
  ASSERT_EQ(cfg.vocab_size, g.vocab);
  const int L = int(cfg.num_hidden_layers);

  // RoPE frequencies: HF's fp32 formula; libm powf and torch's pow agree to the bit for these
  // head dims, and within 1 ulp in rare entries at head_dim >= 128.
  std::vector<float> inv_freq(size_t(cfg.head_dim() / 2));
  cpu::rope_inv_freq(inv_freq.data(), cfg.head_dim(), cfg.rope_theta);
  ASSERT_EQ(inv_freq.size(), g.inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i)
    EXPECT_LE(std::abs(int64_t(float_to_bits(inv_freq[i])) - int64_t(float_to_bits(g.inv_freq[i]))), 1)
        << "inv_freq[" << i << "] " << inv_freq[i] << " vs HF " << g.inv_freq[i];

  const Logits whole = run_stages(reader, {whole_model(L)}, g, 2);
  double abs_last = 0, abs_all = 0;
  const double rel_last = max_rel_error(whole.last, g.logits, g.n_seq, g.vocab, &abs_last);
  const double rel_all = max_rel_error(whole.all, g.logits_all, g.n_seq, g.seq_len * g.vocab, &abs_all);
  std::printf("[golden] %-24s last: rel %.3g abs %.3g | all positions: rel %.3g abs %.3g\n", name.c_str(), rel_last,
              abs_last, rel_all, abs_all);
  RecordProperty("rel_err_last", std::to_string(rel_last));
  RecordProperty("rel_err_all", std::to_string(rel_all));
  EXPECT_LE(rel_last, kRelTol);
  EXPECT_LE(rel_all, kRelTol);
  EXPECT_EQ(top1(whole.last, g.n_seq, g.vocab), g.next_token);
  EXPECT_EQ(top1(whole.all, g.n_seq * g.seq_len, g.vocab), top1(g.logits_all, g.n_seq * g.seq_len, g.vocab));

  // The same model in 2 and 3 stages, and with 1 / 3 threads: bit-identical.
  std::vector<std::vector<StageLayers>> splits = {
      {{0, 2, 0, 1}, {1, 2, 1, L}},
      {{0, 3, 0, 1}, {1, 3, 1, L - 1}, {2, 3, L - 1, L}},
  };
  for (const auto& ranges : splits) {
    const Logits split = run_stages(reader, ranges, g, 2);
    EXPECT_EQ(split.last, whole.last) << ranges.size() << " stages";
    EXPECT_EQ(split.all, whole.all) << ranges.size() << " stages";
  }
  for (int threads : {1, 3}) {
    const Logits other = run_stages(reader, {whole_model(L)}, g, threads);
    EXPECT_EQ(other.last, whole.last) << threads << " threads";
    EXPECT_EQ(other.all, whole.all) << threads << " threads";
  }
}

// A middle stage reads exactly its own layers' datasets and nothing else.
TEST_P(GoldenCase, StageReadsOnlyItsDatasets) {
  const std::string h5 = converted_path(GetParam(), "_stage");
  convert_checkpoint(dir(), h5, std::nullopt);
  WeightReader reader(h5);
  const ModelConfig& cfg = reader.config();
  const int L = int(cfg.num_hidden_layers);
  for (StageLayers r : {StageLayers{1, 3, 1, L - 1}, StageLayers{1, 2, L - 1, L}, StageLayers{0, 2, 0, 1}}) {
    WeightReader fresh(h5);
    auto stage = make_cpu_stage(fresh, r, 1);
    int64_t expected = 0;
    for (const auto& spec : stage_tensor_specs(cfg, r))
      expected += fresh.storage_bytes(spec.path);
    EXPECT_EQ(fresh.bytes_read(), expected) << "range [" << r.layer_begin << ", " << r.layer_end << ")";
    EXPECT_GT(stage->weight_bytes(), 0);
  }
}

// A bf16 checkpoint converted to an fp32 file computes the same as the bf16 file (exact widening).
TEST(GoldenBf16, Fp32FileMatchesBf16File) {
  const std::string name = "bf16_gqa4_top3_seq1";
  const std::string src = std::string(LFM2_GOLDEN_DATA_DIR) + "/" + name;
  const Golden g = read_golden(src + "/golden.h5");
  const std::string as_bf16 = converted_path(name, "_bf16"), as_f32 = converted_path(name, "_f32");
  convert_checkpoint(src, as_bf16, DType::BF16);
  convert_checkpoint(src, as_f32, DType::F32);
  WeightReader rb(as_bf16), rf(as_f32);
  EXPECT_EQ(rb.weight_dtype(), DType::BF16);
  EXPECT_EQ(rf.weight_dtype(), DType::F32);
  const int L = int(rb.config().num_hidden_layers);
  EXPECT_EQ(run_stages(rb, {whole_model(L)}, g, 2).all, run_stages(rf, {whole_model(L)}, g, 2).all);
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenCase,
                         ::testing::Values("tied_gqa2_top2", "untied_mha_top1_long", "bf16_gqa4_top3_seq1",
                                           "fused_experts_nobias", "gqa2_hd16_gpu"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lfm2
