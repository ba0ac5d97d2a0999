// The fp8 KV cache on the CPU oracle (--kv-dtype fp8, kernels/paged_kv.h): lfm2-mini cut to 5 layers
// (fp32, seed 9), prompts in chunks through the batch API, greedy. Against the fp32 cache: the logits
// of every prompt position (the same inputs in both runs; every prompt row reads its earlier rows
// from the cache) within a relative error bound, top-1 agreement, and the greedy tokens. And the fp8
// cache's own bits for any chunking, page size and slot count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "batch_driver.h"
#include "common/rng.h"
#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "synth_mini.h"

namespace lfm2 {
namespace {

// The logits of hidden rows (the head of the stage, all positions).
std::vector<float> logits_of(StageExecutor& st, const std::vector<float>& rows, int64_t n, int64_t vocab) {
  float* x = static_cast<float*>(st.alloc_hidden(n));
  std::copy(rows.begin(), rows.end(), x);
  std::vector<float> logits(size_t(n * vocab));
  HeadOutputs head;
  head.all_logits = logits.data();
  st.head(x, 1, n, nullptr, head);
  return logits;
}

TEST(KvFp8, CpuLogitsNearTheFp32CacheAndBitsIndependentOfTheSchedule) {
  ModelConfig cfg;
  const std::string path = test::synth_mini(5, 9, "mini5_kv8.h5", &cfg);
  WeightReader reader(path);
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, K = 8;
  std::vector<test::BatchSeqSpec> seqs;
  CounterRng rng(21, 3);
  uint64_t n = 0;
  for (int len : {70, 17, 40, 33}) {
    test::BatchSeqSpec s;
    for (int t = 0; t < len; ++t) s.prompt.push_back(int32_t(10 + rng.bits(n++) % uint64_t(V - 10)));
    s.seq = int64_t(seqs.size());
    seqs.push_back(s);
  }
  SamplingParams greedy;
  test::Schedule sc;
  sc.chunk = 7;
  auto run = [&](bool fp8, const test::Schedule& s) {
    auto st = make_cpu_stage(reader, whole_model(int(cfg.num_hidden_layers)), 2, false, fp8);
    return test::run_batches(*st, seqs, K, s, greedy, H, test::host_access());
  };
  const test::Outcome ref = run(false, sc), got = run(true, sc);

  // every prompt position's logits, fp8 cache against fp32
  std::vector<float> ref_rows, got_rows;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t p = 0; p < int64_t(seqs[i].prompt.size()); ++p) {
      const auto& a = ref.rows.at({int64_t(i), p});
      const auto& b = got.rows.at({int64_t(i), p});
      ref_rows.insert(ref_rows.end(), a.begin(), a.end());
      got_rows.insert(got_rows.end(), b.begin(), b.end());
    }
  const int64_t rows = int64_t(ref_rows.size()) / H;
  auto st = make_cpu_stage(reader, whole_model(int(cfg.num_hidden_layers)), 2);
  const auto lr = logits_of(*st, ref_rows, rows, V), lg = logits_of(*st, got_rows, rows, V);
  double num = 0, den = 0, top1 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = lr.data() + r * V;
    const float* q = lg.data() + r * V;
    top1 += (std::max_element(p, p + V) - p) == (std::max_element(q, q + V) - q);
    for (int64_t v = 0; v < V; ++v) num += double(q[v] - p[v]) * (q[v] - p[v]), den += double(p[v]) * p[v];
  }
  const double rel = std::sqrt(num / den);
  top1 /= double(rows);
  int64_t same_tokens = 0, tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < size_t(K); ++t) same_tokens += ref.tokens[i][t] == got.tokens[i][t], ++tokens;
  std::printf("[kv fp8] %lld prompt positions: logits rel %.4f, top-1 %.3f; greedy tokens %lld/%lld equal\n",
              (long long)rows, rel, top1, (long long)same_tokens, (long long)tokens);
  // e4m3 keeps 4 significant bits (2^-4 relative per cached value, with the row's scale); measured
  // rel 0.023 here (docs/fp8.md). A wrong scale or a row in the wrong place moves the logits by ~100 %.
  EXPECT_LT(rel, 0.06);
  EXPECT_GT(rel, 0.0);  // the quantization is there
  EXPECT_GE(top1, 0.9);
  EXPECT_GE(same_tokens * 4, tokens * 3);  // the first tokens agree; a flip then changes the rest

  // the fp8 cache's bits: whole prompts, chunks of 1 on pages of 64 with 2 slots, chunks of 3 on 256
  test::Schedule a, b;
  a.chunk = 1, a.page_size = 64, a.n_slots = 2, a.page_seed = 7;
  b.chunk = 3, b.page_size = 256, b.mix = false;
  test::expect_same(got, run(true, test::Schedule{}), "fp8, whole prompts");
  test::expect_same(got, run(true, a), "fp8, chunks of 1, pages of 64, 2 slots");
  test::expect_same(got, run(true, b), "fp8, chunks of 3, pages of 256, decode steps apart");
}

}  // namespace
}  // namespace lfm2
