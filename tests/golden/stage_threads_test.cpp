// The CPU executor at a size where every op really splits across threads (synthetic weights from
// h5pack synth, lfm2-mini shape cut to 5 layers): 1, 2 and 3 threads, and 1 vs 3 stages, must give
// bit-identical hidden states and logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "synth_mini.h"

namespace lfm2 {
namespace {

std::vector<float> run(WeightReader& reader, const std::vector<StageLayers>& stages, const std::vector<int32_t>& ids,
                       int64_t n_seq, int64_t seq_len, int threads) {
  const ModelConfig& cfg = reader.config();
  const int64_t T = n_seq * seq_len;
  std::vector<float> hidden(size_t(T * cfg.hidden_size)), logits(size_t(T * cfg.vocab_size));
  for (const StageLayers& r : stages) {
    auto stage = make_cpu_stage(reader, r, threads);
    float* x = static_cast<float*>(stage->alloc_hidden(T));
    if (r.is_first())
      stage->embed(ids.data(), n_seq, seq_len, x);
    else
      std::memcpy(x, hidden.data(), hidden.size() * sizeof(float));
    stage->forward(x, n_seq, seq_len);
    std::memcpy(hidden.data(), x, hidden.size() * sizeof(float));
    if (r.is_last()) {
      HeadOutputs head;
      head.all_logits = logits.data();
      stage->head(x, n_seq, seq_len, nullptr, head);
    }
  }
  return logits;
}

TEST(CpuStage, BitIdenticalForAnyThreadCountAndSplit) {
  ModelConfig cfg;
  WeightReader reader(test::synth_mini(5, 7, "mini5_f32.h5", &cfg));
  ASSERT_TRUE(cfg.is_attention(2));

  const int64_t n_seq = 3, seq_len = 41;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(size_t(n_seq * seq_len));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(cfg.vocab_size));

  const auto t0 = std::chrono::steady_clock::now();
  const auto ref = run(reader, {whole_model(5)}, ids, n_seq, seq_len, 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[stage] lfm2-mini x5 layers, %lld tokens, 1 thread: %.2f s\n", (long long)(n_seq * seq_len), secs);
  float max_abs = 0;
  for (float v : ref) {
    ASSERT_TRUE(std::isfinite(v));
    max_abs = std::max(max_abs, std::fabs(v));
  }
  EXPECT_GT(max_abs, 0.1f);  // not a degenerate all-zero run
  EXPECT_EQ(run(reader, {whole_model(5)}, ids, n_seq, seq_len, 2), ref);
  EXPECT_EQ(run(reader, {whole_model(5)}, ids, n_seq, seq_len, 3), ref);
  EXPECT_EQ(run(reader, {{0, 3, 0, 2}, {1, 3, 2, 3}, {2, 3, 3, 5}}, ids, n_seq, seq_len, 3), ref);
}

}  // namespace
}  // namespace lfm2
