// The whole CUDA stage against the CPU stage on small synthesized models (h5pack synth): logits of
// every position for fp32 (tight), bf16 and fp16 (norm-relative error, top-1 agreement); the CUDA
// stage bit-identical run to run and for a 1- vs 3-stage split. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "cuda_test_util.h"
#include "h5pack/presets.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "kernels/argmax.h"
#include "model/cuda_stage.h"
#include "model/stage_executor.h"

namespace lfm2 {
namespace {

using namespace test;

struct Model {
  std::string path;
  ModelConfig cfg;
};

Model make_model(const std::string& preset, int n_layers, DType dtype) {
  Model m;
  m.cfg = synth_preset(preset);
  if (n_layers > 0) {
    m.cfg.num_hidden_layers = n_layers;
    m.cfg.layer_types.resize(size_t(n_layers));
  }
  m.cfg.validate("test config");
  const std::string dir = std::string(LFM2_CUDA_TEST_WORK_DIR);
  std::filesystem::create_directories(dir);
  m.path = dir + "/" + preset + "_" + std::to_string(n_layers) + "_" + dtype_name(dtype) + ".h5";
  SynthOptions opt;
  opt.seed = 11;
  opt.dtype = dtype;
  opt.progress = false;
  synth_weights(m.cfg, m.path, opt);
  return m;
}

std::vector<int32_t> make_ids(const ModelConfig& cfg, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  CounterRng rng(3, 1);
  for (int64_t i = 0; i < n; ++i) ids[i] = int32_t(rng.bits(uint64_t(i)) % uint64_t(cfg.vocab_size));
  return ids;
}

std::vector<float> run_cpu(WeightReader& reader, const std::vector<int32_t>& ids, int64_t n_seq, int64_t seq_len) {
  const ModelConfig& cfg = reader.config();
  auto stage = make_cpu_stage(reader, whole_model(int(cfg.num_hidden_layers)), 0);
  void* x = stage->alloc_hidden(n_seq * seq_len);
  stage->embed(ids.data(), n_seq, seq_len, x);
  stage->forward(x, n_seq, seq_len);
  std::vector<float> logits(static_cast<size_t>(n_seq * seq_len * cfg.vocab_size));
  HeadOutputs head;
  head.all_logits = logits.data();
  stage->head(x, n_seq, seq_len, nullptr, head);
  return logits;
}

// Runs the given stage split on the GPU, hidden states passed stage to stage through the host.
std::vector<float> run_cuda(WeightReader& reader, const std::vector<StageLayers>& stages, DType dt,
                            const std::vector<int32_t>& ids, int64_t n_seq, int64_t seq_len, bool all_positions) {
  const ModelConfig& cfg = reader.config();
  const int64_t T = n_seq * seq_len;
  std::vector<float> hidden(static_cast<size_t>(T * cfg.hidden_size));
  std::vector<float> logits(static_cast<size_t>((all_positions ? T : n_seq) * cfg.vocab_size));
  for (const StageLayers& r : stages) {
    auto stage = make_cuda_stage(reader, r, dt, 0);
    EXPECT_TRUE(stage->on_device());
    void* x = stage->alloc_hidden(T);
    if (r.is_first())
      stage->embed(ids.data(), n_seq, seq_len, x);
    else
      CUDA_CHECK(cudaMemcpyAsync(x, hidden.data(), hidden.size() * sizeof(float), cudaMemcpyHostToDevice,
                                 stage->stream()));
    stage->forward(x, n_seq, seq_len);
    stage->synchronize();
    CUDA_CHECK(cudaMemcpy(hidden.data(), x, hidden.size() * sizeof(float), cudaMemcpyDeviceToHost));
    if (r.is_last()) {
      HeadOutputs head;
      (all_positions ? head.all_logits : head.logits) = logits.data();
      stage->head(x, n_seq, seq_len, nullptr, head);
      stage->synchronize();
    }
  }
  return logits;
}

struct Diff {
  double rel = 0, max_abs = 0, row_median = 0;  // norm-relative: all logits, median row
  int64_t top1_same = 0, rows = 0;
};

Diff diff(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(got[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
    d.max_abs = std::max(d.max_abs, std::isfinite(got[i]) ? std::fabs(e) : INFINITY);
  }
  d.rel = std::sqrt(num / den);
  d.rows = int64_t(ref.size()) / V;
  std::vector<double> row_rel;
  for (int64_t r = 0; r < d.rows; ++r) {
    double rn = 0, rd = 0;
    for (int64_t i = r * V; i < (r + 1) * V; ++i) {
      rn += (double(got[i]) - double(ref[i])) * (double(got[i]) - double(ref[i]));
      rd += double(ref[i]) * double(ref[i]);
    }
    row_rel.push_back(std::sqrt(rn / rd));
  }
  std::sort(row_rel.begin(), row_rel.end());
  d.row_median = row_rel[row_rel.size() / 2];
  for (int64_t r = 0; r < d.rows; ++r) {
    auto a = std::max_element(got.begin() + r * V, got.begin() + (r + 1) * V) - (got.begin() + r * V);
    auto b = std::max_element(ref.begin() + r * V, ref.begin() + (r + 1) * V) - (ref.begin() + r * V);
    d.top1_same += a == b;
  }
  return d;
}

class CudaStageTest : public CudaTest {};

void check_against_cpu(const std::string& preset, int n_layers, int64_t n_seq, int64_t seq_len) {
  const Model m = make_model(preset, n_layers, DType::F32);
  WeightReader reader(m.path);
  const auto ids = make_ids(m.cfg, n_seq * seq_len);
  const auto ref = run_cpu(reader, ids, n_seq, seq_len);
  const int L = int(m.cfg.num_hidden_layers);
  struct Case {
    DType dt;
    double max_rel, min_top1;
  };
  for (const Case c : {Case{DType::F32, 2e-5, 0.99}, Case{DType::BF16, 0.1, 0.9}, Case{DType::F16, 5e-2, 0.95}}) {
    const auto got = run_cuda(reader, {whole_model(L)}, c.dt, ids, n_seq, seq_len, true);
    const Diff d = diff(got, ref, m.cfg.vocab_size);
    std::printf("[cuda stage] %s x%d layers, %lldx%lld tokens, %s: rel %.3g (median row %.3g), max|d| %.3g, top-1 %lld/%lld\n",
                preset.c_str(), L, (long long)n_seq, (long long)seq_len, dtype_name(c.dt), d.rel, d.row_median, d.max_abs,
                (long long)d.top1_same, (long long)d.rows);
    EXPECT_LE(d.rel, c.max_rel) << dtype_name(c.dt);
    EXPECT_GE(double(d.top1_same), c.min_top1 * double(d.rows)) << dtype_name(c.dt);
    // last-position head = the last row of each sequence of the all-position logits
    if (c.dt == DType::F32) {
      const auto last = run_cuda(reader, {whole_model(L)}, c.dt, ids, n_seq, seq_len, false);
      const int64_t V = m.cfg.vocab_size;
      for (int64_t s = 0; s < n_seq; ++s)
        EXPECT_TRUE(close(std::vector<float>(last.begin() + s * V, last.begin() + (s + 1) * V),
                          std::vector<float>(got.begin() + ((s + 1) * seq_len - 1) * V,
                                             got.begin() + ((s + 1) * seq_len) * V),
                          1e-5, 1e-5))
            << "sequence " << s;
    }
  }
}

TEST_F(CudaStageTest, TinyMatchesCpu) { check_against_cpu("lfm2-tiny", 0, 3, 70); }

TEST_F(CudaStageTest, MiniMatchesCpu) { check_against_cpu("lfm2-mini", 5, 2, 41); }

TEST_F(CudaStageTest, DeterministicAcrossRunsAndSplits) {
  const Model m = make_model("lfm2-tiny", 0, DType::BF16);
  WeightReader reader(m.path);
  const int64_t n_seq = 4, seq_len = 33;
  const auto ids = make_ids(m.cfg, n_seq * seq_len);
  for (DType dt : {DType::F32, DType::BF16}) {
    const auto a = run_cuda(reader, {whole_model(6)}, dt, ids, n_seq, seq_len, true);
    const auto b = run_cuda(reader, {whole_model(6)}, dt, ids, n_seq, seq_len, true);
    const auto c = run_cuda(reader, {{0, 3, 0, 2}, {1, 3, 2, 3}, {2, 3, 3, 6}}, dt, ids, n_seq,
                            seq_len, true);
    EXPECT_EQ(a, b) << dtype_name(dt);
    EXPECT_EQ(a, c) << dtype_name(dt);
  }
}

// A sequence's logits are bit-identical whichever microbatch computes it (SPEC §3 on the GPU): the
// GEMM algorithms are pinned per shape without split-K, the grouped GEMM's rows do not depend on
// their neighbours, and every other kernel works per token, per row or per (sequence, head).
TEST_F(CudaStageTest, BitIdenticalAcrossMicrobatchSizes) {
  const Model m = make_model("lfm2-mini", 5, DType::BF16);
  WeightReader reader(m.path);
  const int L = int(m.cfg.num_hidden_layers);
  const int64_t n_seq = 6, seq_len = 21, V = m.cfg.vocab_size, per_seq = seq_len * V;
  const auto ids = make_ids(m.cfg, n_seq * seq_len);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    auto stage = make_cuda_stage(reader, whole_model(L), dt, 0);
    void* x = stage->alloc_hidden(n_seq * seq_len);
    auto run = [&](int64_t s0, int64_t ns) {
      std::vector<float> logits(static_cast<size_t>(ns * per_seq));
      stage->embed(ids.data() + s0 * seq_len, ns, seq_len, x);
      stage->forward(x, ns, seq_len);
      HeadOutputs head;
      head.all_logits = logits.data();
      stage->head(x, ns, seq_len, nullptr, head);
      stage->synchronize();
      return logits;
    };
    const auto all = run(0, n_seq);
    for (int64_t mb : {int64_t(1), int64_t(2), int64_t(4)})
      for (int64_t s0 = 0; s0 < n_seq; s0 += mb) {
        const int64_t ns = std::min(mb, n_seq - s0);
        const auto part = run(s0, ns);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + s0 * per_seq))
            << dtype_name(dt) << ": sequences " << s0 << ".." << s0 + ns - 1 << " in a microbatch of " << ns
            << " differ from the same sequences in one of " << n_seq;
      }
  }
}

TEST_F(CudaStageTest, RejectsMoreTokensThanAllocated) {
  const Model m = make_model("lfm2-tiny", 0, DType::F32);
  WeightReader reader(m.path);
  auto stage = make_cuda_stage(reader, whole_model(6), DType::F32, 0);
  void* x = stage->alloc_hidden(8);
  EXPECT_THROW(stage->forward(x, 3, 3), Error);
}

// The head on the device: next_token and margin equal cpu::argmax_margin of the logits it returned,
// all three copied asynchronously into pinned memory from alloc_host(), over two chunks of rows
// (both logits slots in use); the layers replayed from CUDA Graphs give the bits they give without.
TEST_F(CudaStageTest, HeadOnTheDeviceAndGraphs) {
  const Model m = make_model("lfm2-tiny", 0, DType::BF16);
  WeightReader reader(m.path);
  const int64_t n_seq = 300, seq_len = 5, V = m.cfg.vocab_size;
  const int L = int(m.cfg.num_hidden_layers);
  const auto ids = make_ids(m.cfg, n_seq * seq_len);
  std::vector<float> with_graphs;
  for (bool graphs : {true, false}) {
    auto st = make_cuda_stage(reader, whole_model(L), DType::BF16, 0, false, graphs);
    void* x = st->alloc_hidden(n_seq * seq_len);
    auto* h_ids = static_cast<int32_t*>(st->alloc_host(int64_t(ids.size() * sizeof(int32_t))));
    std::copy(ids.begin(), ids.end(), h_ids);
    HeadOutputs out;
    out.next_token = static_cast<int32_t*>(st->alloc_host(n_seq * int64_t(sizeof(int32_t))));
    out.margin = static_cast<float*>(st->alloc_host(n_seq * int64_t(sizeof(float))));
    out.logits = static_cast<float*>(st->alloc_host(n_seq * V * int64_t(sizeof(float))));
    for (int rep = 0; rep < 2; ++rep) {  // the second replays the captured graph
      st->embed(h_ids, n_seq, seq_len, x);
      st->forward(x, n_seq, seq_len);
      st->head(x, n_seq, seq_len, nullptr, out);
    }
    st->synchronize();
    std::vector<int32_t> top(static_cast<size_t>(n_seq));
    std::vector<float> margin(static_cast<size_t>(n_seq));
    cpu::argmax_margin(top.data(), margin.data(), out.logits, n_seq, V);
    EXPECT_EQ(top, std::vector<int32_t>(out.next_token, out.next_token + n_seq)) << "graphs " << graphs;
    EXPECT_EQ(margin, std::vector<float>(out.margin, out.margin + n_seq)) << "graphs " << graphs;
    std::vector<float> logits(out.logits, out.logits + n_seq * V);
    if (graphs)
      with_graphs = logits;
    else
      EXPECT_EQ(logits, with_graphs);
  }
}

}  // namespace
}  // namespace lfm2
