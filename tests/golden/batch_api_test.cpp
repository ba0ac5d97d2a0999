// The CPU executor's batch API of generation (model/step_batch.h): every row's hidden state and every
// token bit-identical whatever the schedule: today's calls on padded prompts, whole prompts at
// once, prompts in chunks of 1, 7 and 64 beside other sequences' decode rows, fewer slots than
// sequences (slots reused), pages of 16, 64 or 256 positions placed by different shuffles; greedy
// and sampled (per sequence). And its refusals: a step past the pages mapped, a bad slot.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "batch_driver.h"
#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "synth_mini.h"

namespace lfm2 {
namespace {

using test::BatchSeqSpec;
using test::Outcome;
using test::Schedule;
using test::expect_same;

std::vector<BatchSeqSpec> make_seqs(const ModelConfig& cfg, const std::vector<int>& lengths, uint64_t seed) {
  std::vector<BatchSeqSpec> seqs;
  CounterRng rng(seed, 7);
  uint64_t n = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    BatchSeqSpec s;
    for (int t = 0; t < lengths[i]; ++t) s.prompt.push_back(int32_t(10 + rng.bits(n++) % uint64_t(cfg.vocab_size - 10)));
    s.seq = 100 + int64_t(i);
    s.sampling.temperature = 50.0f + 10.0f * float(i % 3);  // the synthetic model's logits are steep
    s.sampling.top_k = int32_t(20 + i);
    s.sampling.top_p = 0.9f;
    s.sampling.seed = 5 + i;
    seqs.push_back(s);
  }
  return seqs;
}

class CpuBatchApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cfg_ = new ModelConfig;
    path_ = new std::string(test::synth_mini(4, 13, "mini4_batch_f32.h5", cfg_));
  }
  static void TearDownTestSuite() {
    delete cfg_;
    delete path_;
  }
  std::unique_ptr<StageExecutor> stage(WeightReader& r) { return make_cpu_stage(r, whole_model(4), 2); }
  static ModelConfig* cfg_;
  static std::string* path_;
};
ModelConfig* CpuBatchApi::cfg_ = nullptr;
std::string* CpuBatchApi::path_ = nullptr;

// Today's calls and the batch API under five schedules: the same rows and tokens, greedy.
TEST_F(CpuBatchApi, EverySchedulesRowsAndTokensEqualTodaysCalls) {
  WeightReader reader(*path_);
  const auto seqs = make_seqs(*cfg_, {70, 5, 33, 1, 66}, 1);
  const int64_t K = 4, H = cfg_->hidden_size;
  SamplingParams greedy;
  greedy.eos = {3};
  const Outcome old = test::run_old(*stage(reader), seqs, K, greedy, H, test::host_access());
  for (const auto& [name, sched] : test::schedules()) {
    const Outcome got = test::run_batches(*stage(reader), seqs, K, sched, greedy, H, test::host_access());
    test::expect_same(old, got, name);
    std::printf("[batch api] %s: %lld steps, %lld mixed\n", name.c_str(), (long long)got.steps, (long long)got.mixed_steps);
  }
}

// Sampling keyed by (seed, sequence, new token): today's calls (one SamplingParams, sequences keyed
// from first_sequence) and the batch API with the same defaults; per-sequence parameters whatever
// the schedule.
TEST_F(CpuBatchApi, SampledTokensAreKeyedBySequenceAndStep) {
  WeightReader reader(*path_);
  auto seqs = make_seqs(*cfg_, {9, 17, 4}, 2);
  const int64_t K = 6, H = cfg_->hidden_size;
  SamplingParams p;
  p.temperature = 60.0f, p.top_k = 40, p.top_p = 0.95f, p.seed = 77, p.first_sequence = 100;
  const Outcome old = test::run_old(*stage(reader), seqs, K, p, H, test::host_access());
  Schedule s;
  s.chunk = 5;
  const Outcome batch = test::run_batches(*stage(reader), seqs, K, s, p, H, test::host_access());
  expect_same(old, batch, "defaults");
  s.per_seq_sampling = true;
  const Outcome a = test::run_batches(*stage(reader), seqs, K, s, p, H, test::host_access());
  Schedule t;
  t.per_seq_sampling = true, t.n_slots = 1, t.chunk = 3, t.page_size = 32;
  const Outcome b = test::run_batches(*stage(reader), seqs, K, t, p, H, test::host_access());
  expect_same(a, b, "per-sequence sampling");
  EXPECT_NE(a.tokens, old.tokens);  // other parameters, other draws
  for (const auto& t : a.tokens) EXPECT_NE(t, std::vector<int32_t>(t.size(), t[0])) << "no sampling seen";
}

TEST_F(CpuBatchApi, RefusesStepsOutsideItsState) {
  WeightReader reader(*path_);
  auto st = stage(reader);
  st->alloc_batch_state({2, 4, 16, 2}, SamplingParams{});
  void* x = st->alloc_hidden(64);
  auto* ids = static_cast<int32_t*>(st->alloc_host(64 * 4));
  for (int i = 0; i < 64; ++i) ids[i] = 20 + i;
  StepBatch b;
  b.seqs.push_back(BatchSeq{0, 0, 0, 20, 0, false});
  st->embed_batch(b, ids, nullptr, x);
  EXPECT_THROW(st->forward_batch(x, b), Error);  // no pages mapped
  const int32_t pages[2] = {3, 1};
  st->map_pages(0, 0, pages, 1);
  EXPECT_THROW(st->forward_batch(x, b), Error);  // positions 16..19 have no page
  st->map_pages(0, 1, pages + 1, 1);
  st->forward_batch(x, b);
  b.seqs[0].slot = 2;
  EXPECT_THROW(st->forward_batch(x, b), Error);  // slot outside the state
  const int32_t bad = 4;
  EXPECT_THROW(st->map_pages(1, 0, &bad, 1), Error);  // page outside the pool
  EXPECT_THROW(st->map_pages(1, 1, pages, 2), Error);  // past the table row
  EXPECT_THROW(st->alloc_batch_state({2, 4, 24, 2}, SamplingParams{}), Error);  // page size
}

}  // namespace
}  // namespace lfm2
