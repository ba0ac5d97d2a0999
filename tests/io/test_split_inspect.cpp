// h5pack split (each stage file holds exactly its stage's datasets, all or nothing) and inspect.
#include <gtest/gtest.h>

#include <filesystem>

#include "h5pack/inspect.h"
#include "h5pack/presets.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "io_test_util.h"
#include "plan/layer_partition.h"

namespace lfm2 {
namespace {

using test::ScratchDir;

class SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.seed = 5;
    o.threads = 2;
    o.progress = false;
    synth_weights(cfg_, dir_.file("model.h5"), o);
  }
  ScratchDir dir_;
  ModelConfig cfg_ = synth_preset("lfm2-tiny");
};

TEST_F(SplitTest, EachFileHoldsExactlyItsStage) {
  for (bool tied : {true, false}) {
    ScratchDir out;
    std::string model = dir_.file("model.h5");
    if (!tied) {
      ModelConfig untied = cfg_;
      untied.tie_word_embeddings = false;
      SynthOptions o;
      o.progress = false;
      model = out.file("untied.h5");
      synth_weights(untied, model, o);
    }
    const auto outs = split_weights(model, 3, out.file("stage-%d.h5"));
    ASSERT_EQ(outs.size(), 3u);
    WeightReader whole(model);
    const auto plans = default_stages(whole.config(), 3);
    for (const auto& plan : plans) {
      const std::string path = out.file("stage-" + std::to_string(plan.stage) + ".h5");
      EXPECT_EQ(outs[size_t(plan.stage)], path);
      std::set<std::string> want;
      const auto specs = stage_tensor_specs(whole.config(), plan);
      for (const auto& s : specs) want.insert(s.path);
      EXPECT_EQ(test::list_datasets(path), want) << path;
      EXPECT_EQ(want.count("embed_tokens"), (plan.is_first() || (plan.is_last() && tied)) ? 1u : 0u);
      EXPECT_EQ(want.count("lm_head"), (plan.is_last() && !tied) ? 1u : 0u);
      WeightReader r(path);
      ASSERT_TRUE(r.is_stage_file());
      EXPECT_EQ(r.stage().stage, plan.stage);
      EXPECT_EQ(r.stage().n_stages, 3);
      EXPECT_EQ(r.stage().layer_begin, plan.layer_begin);
      EXPECT_EQ(r.stage().layer_end, plan.layer_end);
      EXPECT_EQ(r.config().to_json_text(), whole.config().to_json_text());
      for (const auto& s : specs) {
        std::vector<uint8_t> a(size_t(s.numel()) * dtype_size(r.dtype(s.path))), b(a.size());
        r.read_rows_raw(s.path, 0, s.shape[0], a.data());
        whole.read_rows_raw(s.path, 0, s.shape[0], b.data());
        ASSERT_EQ(a, b) << path << " " << s.path;
      }
    }
  }
}

TEST_F(SplitTest, LayerOverride) {
  const auto outs = split_weights(dir_.file("model.h5"), 3, dir_.file("s%d.h5"), "1,2,3");
  WeightReader last(outs[2]);
  EXPECT_EQ(last.stage().layer_begin, 3);
  EXPECT_EQ(last.stage().layer_end, 6);
  EXPECT_TRUE(last.has("layers/3/operator_norm"));
  EXPECT_FALSE(last.has("layers/2/operator_norm"));
  EXPECT_THROW(split_weights(dir_.file("model.h5"), 3, dir_.file("x%d.h5"), "2,2,3"), Error);
}

TEST_F(SplitTest, AllOrNothing) {
  // Stage 2's output directory does not exist: stages 0 and 1 must not be left behind either.
  std::filesystem::create_directory(dir_.file("a"));
  try {
    split_weights(dir_.file("model.h5"), 3, dir_.file("a/%d/stage.h5"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a/0/stage.h5"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_.file("a")));
  std::filesystem::create_directories(dir_.file("a/0"));
  std::filesystem::create_directories(dir_.file("a/1"));
  EXPECT_THROW(split_weights(dir_.file("model.h5"), 3, dir_.file("a/%d/stage.h5")), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.file("a/0")));
  EXPECT_TRUE(std::filesystem::is_empty(dir_.file("a/1")));
}

TEST_F(SplitTest, BadArguments) {
  EXPECT_THROW(split_weights(dir_.file("model.h5"), 3, dir_.file("nopattern.h5")), Error);
  EXPECT_THROW(split_weights(dir_.file("model.h5"), 3, dir_.file("%s-%d.h5")), Error);
  EXPECT_THROW(split_weights(dir_.file("model.h5"), 7, dir_.file("s%d.h5")), Error);  // 6 layers
  EXPECT_THROW(split_weights(dir_.file("missing.h5"), 2, dir_.file("s%d.h5")), Error);
  const auto outs = split_weights(dir_.file("model.h5"), 2, dir_.file("s%d.h5"));
  EXPECT_THROW(split_weights(outs[0], 1, dir_.file("t%d.h5")), Error);  // already a stage file
  EXPECT_EQ(stage_path("out/stage-%d.h5", 12), "out/stage-12.h5");
}

TEST_F(SplitTest, InspectCountsAndStageBytes) {
  const InspectReport r = inspect_weights(dir_.file("model.h5"), 3);
  EXPECT_EQ(r.model_params, cfg_.total_params());
  EXPECT_EQ(r.file_params, cfg_.total_params());
  EXPECT_EQ(r.datasets.size(), model_tensor_specs(cfg_).size());
  EXPECT_EQ(r.weight_dtype, DType::BF16);
  ASSERT_EQ(r.stages.size(), 3u);
  // Stage bytes: what each split file holds, and the layer ranges tile the file in order.
  const auto outs = split_weights(dir_.file("model.h5"), 3, dir_.file("s%d.h5"));
  for (int s = 0; s < 3; ++s) {
    const InspectReport part = inspect_weights(outs[size_t(s)]);
    EXPECT_EQ(r.stages[size_t(s)].bytes, part.file_bytes) << s;
    EXPECT_EQ(r.stages[size_t(s)].params, part.file_params) << s;
    EXPECT_TRUE(part.is_stage_file);
    if (s > 0) {
      EXPECT_LE(r.stages[size_t(s) - 1].file_end, r.stages[size_t(s)].file_begin);
    }
  }
  const std::string text = format_report(r);
  EXPECT_NE(text.find("layers/5/feed_forward/experts/w2"), std::string::npos);
  EXPECT_NE(text.find("parameters: " + human_count(cfg_.total_params())), std::string::npos);
  EXPECT_NE(text.find("stage 2: layers "), std::string::npos);
  EXPECT_EQ(human_count(8339930560), "8.34 B");
  EXPECT_EQ(human_bytes(16680064768), "16.68 GB");
  EXPECT_EQ(human_count(43700000), "43.70 M");
  EXPECT_EQ(human_count(999), "999");
  EXPECT_EQ(human_bytes(12288), "12.29 kB");
  EXPECT_EQ(human_bytes(128), "128 B");
}

}  // namespace
}  // namespace lfm2
