// Generation's finished sequences on the CPU executor: embed_tokens flags the rows whose fed-back
// token is an EOS id, and decode leaves them out of the experts. The other rows must come out
// bit-identical to a decode that computes every row; the flagged rows must not.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "synth_mini.h"

namespace lfm2 {
namespace {

TEST(CpuStage, FinishedRowsSkipTheExpertsAndChangeNothingElse) {
  ModelConfig cfg;
  WeightReader reader(test::synth_mini(4, 11, "mini4_finished_f32.h5", &cfg));
  int moe_layers = 0;
  for (int l = 0; l < 4; ++l) moe_layers += cfg.is_moe(l);
  ASSERT_GT(moe_layers, 0);

  const int64_t N = 4, S = 6, H = cfg.hidden_size;
  const int32_t eos = 3;
  std::mt19937 rng(9);
  std::vector<int32_t> ids(size_t(N * S)), lengths{6, 4, 5, 6};
  for (auto& id : ids) id = int32_t(10 + rng() % uint32_t(cfg.vocab_size - 10));
  const std::vector<int32_t> fed{17, eos, 250, eos};  // rows 1 and 3 have finished

  // Prefill, then decode step 1 with `fed`; the stage knows `eos_ids` as end-of-sequence ids.
  auto step = [&](const std::vector<int32_t>& eos_ids, std::vector<float>* flags) {
    auto stage = make_cpu_stage(reader, whole_model(4), 2);
    SamplingParams sampling;
    sampling.eos = eos_ids;
    stage->alloc_state(N, S + 2, lengths.data(), sampling);
    float* x = static_cast<float*>(stage->alloc_hidden(N * S));
    stage->embed(ids.data(), N, S, x);
    stage->prefill(x, 0, N, S);
    int32_t* tokens = stage->alloc_tokens(N);
    std::memcpy(tokens, fed.data(), fed.size() * sizeof(int32_t));
    stage->embed_tokens(tokens, N, x);
    const float* f = decode_flags(x, N, H);
    flags->assign(f, f + N);
    stage->decode(x, 0, N, 1);
    return std::vector<float>(x, x + N * H);
  };
  std::vector<float> flags_skip, flags_all;
  const auto skip = step({eos}, &flags_skip);
  const auto all = step({}, &flags_all);
  EXPECT_EQ(flags_skip, (std::vector<float>{0, 1, 0, 1}));
  EXPECT_EQ(flags_all, (std::vector<float>(size_t(N), 0.0f)));
  for (int64_t s = 0; s < N; ++s) {
    const std::vector<float> a(skip.begin() + s * H, skip.begin() + (s + 1) * H);
    const std::vector<float> b(all.begin() + s * H, all.begin() + (s + 1) * H);
    if (flags_skip[size_t(s)] == 0)
      EXPECT_EQ(a, b) << "live sequence " << s;
    else
      EXPECT_NE(a, b) << "finished sequence " << s << " went through the experts";
  }
}

}  // namespace
}  // namespace lfm2
